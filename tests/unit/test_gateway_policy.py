"""Policies (domain.policy, pure): the schema refuses what does not type-check, the defaults forbid what they say, a
tenant's permit cannot lift a provider's forbid, a tenant's forbid narrows, and a tenant's policies judge only its
own members."""
from __future__ import annotations

import uuid

import cedarpy
import pytest

from services.gateway.domain.policy import (
    BASE_PERMIT_ID,
    Caller,
    Policy,
    PolicyBook,
    PolicyInvalid,
    Resource,
    check,
    load_defaults,
    operation,
    parse_one,
    schema_text,
)

OPS = [operation("createAllocation", "allocations"), operation("createVolume", "storage"),
       operation("attachVolume", "storage"), operation("requestPowerAction", "allocations"),
       operation("createNetwork", "networks")]
SCHEMA = cedarpy.Schema.from_str(schema_text(OPS))
DEFAULTS = load_defaults(SCHEMA)


def allocation(**over) -> Resource:
    attrs = {"name": "a", "shape": "vm.1gpu", "gpu_count": 1, "gpu_model": "H100", "pool": "shared",
             "image": "ubuntu-24.04", "image_approved": True, "spot": False, "privileged": False,
             "priority_class": "normal"}
    labels = over.pop("labels", {})
    return Resource("createAllocation", "Allocation", {**attrs, **over}, labels)


def member(tenant_id: uuid.UUID, role: str = "tenant_user") -> Caller:
    return Caller(uuid.uuid4(), role, tenant_id)


def tenant_policy(tenant_id: uuid.UUID, text: str, policy_id: str | None = None) -> Policy:
    return Policy(policy_id or str(uuid.uuid4()), "tenant", tenant_id, check(text, SCHEMA, tenant_id=tenant_id))


def provider_policy(text: str, policy_id: str | None = None) -> Policy:
    return Policy(policy_id or str(uuid.uuid4()), "provider", None, check(text, SCHEMA))


def test_a_policy_that_does_not_type_check_is_refused_with_the_validators_message():
    with pytest.raises(PolicyInvalid, match="expected Long but saw String"):
        check('forbid (principal, action, resource is Tessera::Allocation) when { resource.gpu_count > "8" };', SCHEMA)
    with pytest.raises(PolicyInvalid, match="optional attribute `image`"):
        check('forbid (principal, action, resource is Tessera::Allocation) when { resource.image == "x" };', SCHEMA)
    with pytest.raises(PolicyInvalid, match="not Cedar"):
        check("forbid (principal, action", SCHEMA)
    with pytest.raises(PolicyInvalid, match="exactly one static policy"):
        check("forbid (principal, action, resource); forbid (principal, action, resource);", SCHEMA)
    with pytest.raises(PolicyInvalid, match="unrecognized action|Action::\"noSuchOperation\""):
        check('forbid (principal, action == Tessera::Action::"noSuchOperation", resource);', SCHEMA)


def test_the_defaults_validate_and_forbid_more_than_8_gpus_unapproved_images_and_privileged_workloads():
    book, caller = PolicyBook(SCHEMA, DEFAULTS), member(uuid.uuid4())
    assert book.decide(caller, allocation()).allowed
    for resource, policy_id in ((allocation(gpu_count=16), "tessera.max-8-gpus"),
                                (allocation(image_approved=False), "tessera.approved-images"),
                                (allocation(privileged=True), "tessera.no-privileged")):
        decision = book.decide(caller, resource)
        assert not decision.allowed and decision.policy_ids == (policy_id,)
        assert decision.reason and decision.reason != policy_id
    assert book.decide(caller, allocation(gpu_count=8)).allowed


def test_a_tenant_permit_cannot_override_a_provider_forbid():
    tenant_id = uuid.uuid4()
    generous = tenant_policy(tenant_id, "permit (principal, action, resource);")
    specific = tenant_policy(tenant_id, 'permit (principal, action == Tessera::Action::"createAllocation", '
                                        'resource is Tessera::Allocation) when { resource.gpu_count > 8 };')
    book = PolicyBook(SCHEMA, DEFAULTS + [generous, specific])
    decision = book.decide(member(tenant_id, "tenant_admin"), allocation(gpu_count=16))
    assert not decision.allowed and decision.policy_ids == ("tessera.max-8-gpus",)
    assert BASE_PERMIT_ID not in decision.policy_ids


def test_a_tenant_forbid_narrows_within_the_provider_bounds_and_names_itself():
    tenant_id = uuid.uuid4()
    two = tenant_policy(tenant_id, '@reason("at most 2 GPUs per request")\n'
                                   'forbid (principal in Tessera::Role::"tenant_user", action, '
                                   'resource is Tessera::Allocation) when { resource.gpu_count > 2 };', "two-gpus")
    vm_only = tenant_policy(tenant_id, 'forbid (principal, action == Tessera::Action::"createAllocation", '
                                       'resource is Tessera::Allocation) unless { resource.shape like "vm.*" };')
    book = PolicyBook(SCHEMA, DEFAULTS + [two, vm_only])
    user = member(tenant_id)
    assert book.decide(user, allocation(gpu_count=2, shape="vm.2gpu")).allowed
    denied = book.decide(user, allocation(gpu_count=4, shape="vm.4gpu"))
    assert (denied.allowed, denied.policy_ids, denied.reason) == (False, ("two-gpus",), "at most 2 GPUs per request")
    assert book.decide(member(tenant_id, "tenant_admin"), allocation(gpu_count=4, shape="vm.4gpu")).allowed
    bare = book.decide(member(tenant_id, "tenant_admin"), allocation(gpu_count=1, shape="bm.1gpu"))
    assert not bare.allowed and bare.policy_ids == (vm_only.policy_id,)
    # both layers forbid: the provider's policy is named first
    both = book.decide(user, allocation(gpu_count=16, shape="vm.16gpu"))
    assert both.policy_ids[0] == "tessera.max-8-gpus" and "two-gpus" in both.policy_ids


def test_a_tenants_policies_judge_only_its_own_members():
    mine, other = uuid.uuid4(), uuid.uuid4()
    forbid_all = tenant_policy(mine, "forbid (principal, action, resource);")
    book = PolicyBook(SCHEMA, DEFAULTS + [forbid_all])
    assert not book.decide(member(mine), allocation()).allowed
    assert book.decide(member(other), allocation()).allowed
    assert book.decide(Caller(uuid.uuid4(), "provider_admin", None), allocation()).allowed
    assert [p.policy_id for p in book.applicable(other)] == [p.policy_id for p in DEFAULTS]


def test_a_tenant_policy_naming_another_tenant_is_refused():
    mine, other = uuid.uuid4(), uuid.uuid4()
    with pytest.raises(PolicyInvalid, match="only its own tenant"):
        check(f'forbid (principal in Tessera::Tenant::"{other}", action, resource);', SCHEMA, tenant_id=mine)
    check(f'forbid (principal in Tessera::Tenant::"{mine}", action, resource);', SCHEMA, tenant_id=mine)


def test_labels_are_tags_and_other_operations_are_judged_as_targets():
    tenant_id = uuid.uuid4()
    labelled = tenant_policy(tenant_id, 'forbid (principal, action, resource is Tessera::Allocation) '
                                        'unless { resource.hasTag("team") };')
    no_networks = provider_policy('forbid (principal, action in Tessera::Action::"networks", resource) '
                                  'when { resource.hasTag("name") && resource.getTag("name") == "blocked" };')
    book = PolicyBook(SCHEMA, DEFAULTS + [labelled, no_networks])
    assert not book.decide(member(tenant_id), allocation()).allowed
    assert book.decide(member(tenant_id), allocation(labels={"team": "ml"})).allowed
    network = Resource("createNetwork", "Target", {"method": "POST", "path": "/v1/networks"}, {"name": "blocked"})
    assert book.decide(member(uuid.uuid4()), network).policy_ids == (no_networks.policy_id,)


def test_a_request_that_does_not_fit_the_schema_is_denied_not_allowed():
    decision = PolicyBook(SCHEMA, DEFAULTS).decide(member(uuid.uuid4()), Resource("createAllocation", "Allocation", {}))
    assert not decision.allowed and decision.policy_ids == ("tessera.schema",)


def test_the_schema_of_the_gateways_route_table_has_one_action_per_judged_operation():
    from services.gateway.entrypoints.http import POLICY_SCHEMA
    text, schema, defaults = POLICY_SCHEMA.get()
    judged = POLICY_SCHEMA.judged
    assert {"createAllocation", "createVolume", "attachVolume", "requestPowerAction", "releaseAllocation"} <= set(judged)
    assert not {"createToken", "createPolicy", "replacePolicy", "deletePolicy"} & set(judged)
    for op in judged:
        assert f'action "{op}" in' in text
    assert [p.policy_id for p in defaults] == ["tessera.max-8-gpus", "tessera.approved-images", "tessera.no-privileged"]
    assert parse_one("forbid (principal, action, resource);")["effect"] == "forbid"


def test_every_operation_with_a_resource_type_of_its_own_builds_that_resource():
    """An operation the schema types (OPERATION_RESOURCE) but whose endpoint builds no resource would be judged as a
    Target that does not fit its action, and every request of it denied; a builder on an untyped operation would
    never be called."""
    from services.gateway.domain.policy import OPERATION_RESOURCE
    from services.gateway.entrypoints.http import ENDPOINTS
    built = {e.operation_id for e in ENDPOINTS if e.policy_resource is not None}
    assert built == set(OPERATION_RESOURCE)


def test_a_denial_names_the_policy_by_its_id_annotation_and_carries_its_stored_id_beside_it():
    from services.gateway.http.policy import PolicyDenied

    tenant, stored_id = uuid.uuid4(), str(uuid.uuid4())
    named = tenant_policy(tenant, '@id("no-spot-for-interns") forbid (principal, action, resource is '
                                  'Tessera::Allocation) when { resource.spot };', stored_id)
    decision = PolicyBook(SCHEMA, [named]).decide(member(tenant), allocation(spot=True))
    assert (decision.allowed, decision.policy_ids, decision.policy_name) == (False, (stored_id,), "no-spot-for-interns")
    assert decision.reason == "policy no-spot-for-interns forbids this request"     # no @reason: named by its @id
    problem = PolicyDenied(decision).to_problem()
    assert (problem.policy_id, problem.policy_name) == (stored_id, "no-spot-for-interns")
    assert "no-spot-for-interns" in problem.detail and stored_id not in problem.detail
    # without an @id, the stored id is its name
    bare = tenant_policy(tenant, "forbid (principal, action, resource is Tessera::Allocation) when { resource.spot };",
                         stored_id)
    problem = PolicyDenied(PolicyBook(SCHEMA, [bare]).decide(member(tenant), allocation(spot=True))).to_problem()
    assert problem.policy_id == problem.policy_name == stored_id and stored_id in problem.detail
