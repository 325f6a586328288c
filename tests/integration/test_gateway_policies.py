"""Policies through the gateway: a provider and a tenant policy refuse a request before anything is sent (403
naming the policy and its reason, audited, nothing in the outbox); CRUD with versions and the validator's 422;
evaluate; who sees what; and a change applies within a second on another replica.

Provider policies apply to every tenant of the session's shared gateway database: each test's provider policy is
written to judge only its own fresh tenant, and deleted at the end."""
from __future__ import annotations

import uuid
from contextlib import asynccontextmanager

from tests.support.gateway import assert_problem, outbox_count
from tests.support.polling import eventually

APPLIES_WITHIN_S = 1.0


def alloc(**over) -> dict:
    return {"name": f"p-{uuid.uuid4().hex[:8]}", "shape": "vm.1gpu", **over}


def at_most_two_gpus(tenant_id: str, reason: str = "users of this tenant: at most 2 GPUs per request") -> dict:
    return {"scope": "tenant", "tenant_id": tenant_id, "name": "two-gpus",
            "text": f'@reason("{reason}")\nforbid (principal in Tessera::Role::"tenant_user", '
                    'action == Tessera::Action::"createAllocation", resource is Tessera::Allocation)\n'
                    "when { resource.gpu_count > 2 };"}


@asynccontextmanager
async def provider_policy(admin, tenant_id: str, condition: str, reason: str):
    """A provider policy forbidding ``condition`` for ``tenant_id``'s requests only; deleted on exit."""
    text = (f'@reason("{reason}")\nforbid (principal, action, resource is Tessera::Allocation)\n'
            f'when {{ resource.tenant == "{tenant_id}" && {condition} }};')
    r = await admin.post("/v1/policies", {"scope": "provider", "name": "no-spot", "text": text})
    assert r.status == 201, r.body
    try:
        yield r.body
    finally:
        assert (await admin.delete(f"/v1/policies/{r.body['id']}")).status == 204


async def audited_denial(api, tenant_id: str) -> int:
    return await api.scalar("SELECT count(*) FROM audit_log WHERE tenant_id=$1 AND action='createAllocation' "
                            "AND status=403 AND outcome='failure' AND record->'outcome'->>'reason' LIKE '%policy-denied'",
                            uuid.UUID(tenant_id))


async def test_a_provider_and_a_tenant_policy_refuse_an_allocation_with_403_naming_them_audited_sending_nothing(api):
    admin = await api.admin()
    tenant_admin, tenant_id = await api.tenant_user("tenant_admin")
    user, _ = await api.new_user(tenant_id)
    created = await tenant_admin.post("/v1/policies", at_most_two_gpus(tenant_id))
    assert created.status == 201, created.body
    async with provider_policy(admin, tenant_id, "resource.spot", "no spot capacity for this tenant") as provider:
        refused = assert_problem(await user.post("/v1/allocations", alloc(shape="vm.4gpu")), 403)
        assert refused["type"].endswith("/policy-denied") and refused["policy_id"] == created.body["id"]
        assert refused["reason"] == "users of this tenant: at most 2 GPUs per request"
        assert created.body["id"] in refused["detail"]
        spot = assert_problem(await user.post("/v1/allocations", alloc(spot=True)), 403)
        assert (spot["policy_id"], spot["reason"]) == (provider["id"], "no spot capacity for this tenant")
        # the tenant's admin is not a tenant_user: its own policy lets it through; the provider's does not
        assert (await tenant_admin.post("/v1/allocations", alloc(spot=True))).body["policy_id"] == provider["id"]
        assert await outbox_count(api, "allocation.request", "tenant_id", tenant_id) == 0
        assert await api.scalar("SELECT count(*) FROM allocations_view WHERE tenant_id=$1", uuid.UUID(tenant_id)) == 0
        assert await audited_denial(api, tenant_id) == 3
        allowed = await user.post("/v1/allocations", alloc(shape="vm.2gpu"))
        assert allowed.status == 202, allowed.body
        assert await outbox_count(api, "allocation.request", "tenant_id", tenant_id) == 1


async def test_the_default_provider_policies_are_listed_read_only_and_cannot_be_deleted(api):
    admin = await api.admin()
    listed = (await admin.get("/v1/policies")).body["items"]
    builtins = {p["id"] for p in listed if p["builtin"]}
    assert builtins == {"tessera.max-8-gpus", "tessera.approved-images", "tessera.no-privileged"}
    assert (await admin.get("/v1/policies/tessera.max-8-gpus")).body["scope"] == "provider"
    assert_problem(await admin.delete("/v1/policies/tessera.max-8-gpus"), 409)


async def test_policies_are_created_replaced_as_new_versions_deleted_and_a_policy_that_does_not_validate_is_a_422(api):
    tenant_admin, tenant_id = await api.tenant_user("tenant_admin")
    bad = dict(at_most_two_gpus(tenant_id), text='forbid (principal, action, resource is Tessera::Allocation) '
                                                  'when { resource.gpu_count > "two" };')
    problem = assert_problem(await tenant_admin.post("/v1/policies", bad), 422, "text")
    assert "expected Long but saw String" in problem["detail"]
    assert_problem(await tenant_admin.post("/v1/policies", dict(bad, text="forbid (principal")), 422, "text")
    created = (await tenant_admin.post("/v1/policies", at_most_two_gpus(tenant_id))).body
    assert (created["version"], created["scope"], created["tenant_id"], created["builtin"]) == (1, "tenant", tenant_id,
                                                                                               False)
    path = f"/v1/policies/{created['id']}"
    replaced = await tenant_admin.call("PUT", path, json_body={"name": "four-gpus", "enabled": False,
                                                               "text": at_most_two_gpus(tenant_id)["text"]})
    assert replaced.status == 200 and replaced.body["version"] == 2 and not replaced.body["enabled"]
    assert_problem(await tenant_admin.call("PUT", path, json_body={"name": "x", "text": bad["text"]}), 422, "text")
    versions = (await tenant_admin.get(path + "/versions")).body["items"]
    assert [(v["version"], v["enabled"], v["deleted"]) for v in versions] == [(1, True, False), (2, False, False)]
    assert [p["id"] for p in (await tenant_admin.get("/v1/policies")).body["items"]] == [created["id"]]
    assert (await tenant_admin.delete(path)).status == 204
    assert_problem(await tenant_admin.get(path), 404)
    assert (await tenant_admin.get("/v1/policies")).body["items"] == []
    assert await outbox_count(api, "gateway.policy_changed", "policy_id", created["id"]) == 3


async def test_evaluate_answers_what_a_request_would_get_with_a_candidate_policy(api):
    tenant_admin, tenant_id = await api.tenant_user("tenant_admin")
    attrs = {"name": "a", "shape": "vm.4gpu", "gpu_count": 4, "pool": "shared", "image_approved": True, "spot": False,
             "privileged": False, "priority_class": "normal"}
    ask = {"operation": "createAllocation", "resource": attrs}
    assert (await tenant_admin.post("/v1/policies/evaluate", ask)).body == {"allowed": True, "policy_ids": [],
                                                                           "reason": None, "errors": []}
    trial = await tenant_admin.post("/v1/policies/evaluate", dict(ask, candidate=at_most_two_gpus(tenant_id)["text"]))
    assert trial.body["allowed"] is False and trial.body["policy_ids"] == ["candidate"]
    as_admin = await tenant_admin.post("/v1/policies/evaluate", dict(ask, role="tenant_admin",
                                                                     candidate=at_most_two_gpus(tenant_id)["text"]))
    assert as_admin.body["allowed"] is True
    too_many = await tenant_admin.post("/v1/policies/evaluate", dict(ask, resource=dict(attrs, gpu_count=16)))
    assert too_many.body["policy_ids"] == ["tessera.max-8-gpus"]
    assert (await tenant_admin.get("/v1/policies")).body["items"] == []   # nothing was stored
    assert_problem(await tenant_admin.post("/v1/policies/evaluate", dict(ask, operation="noSuchThing")), 422,
                   "operation")


async def test_tenant_admins_never_see_or_touch_another_tenants_or_the_providers_policies(api):
    admin = await api.admin()
    mine, my_tenant = await api.tenant_user("tenant_admin")
    theirs, their_tenant = await api.tenant_user("tenant_admin")
    user, _ = await api.new_user(my_tenant)
    their_policy = (await theirs.post("/v1/policies", at_most_two_gpus(their_tenant))).body
    async with provider_policy(admin, their_tenant, "resource.spot", "no spot") as provider:
        for policy in (their_policy, provider):
            path = f"/v1/policies/{policy['id']}"
            assert_problem(await mine.get(path), 404)
            assert_problem(await mine.delete(path), 404)
            assert_problem(await mine.call("PUT", path, json_body={"name": "x", "text": "forbid (principal, action, "
                                                                                         "resource);"}), 404)
        assert (await mine.get("/v1/policies")).body["items"] == []
        assert_problem(await mine.post("/v1/policies", at_most_two_gpus(their_tenant)), 404)
        assert_problem(await mine.post("/v1/policies", {"scope": "provider", "name": "x",
                                                        "text": "forbid (principal, action, resource);"}), 403)
        other = f'forbid (principal in Tessera::Tenant::"{their_tenant}", action, resource);'
        assert "own tenant" in assert_problem(await mine.post("/v1/policies", {"scope": "tenant", "name": "x",
                                                                               "text": other}), 422, "text")["detail"]
        assert_problem(await user.get("/v1/policies"), 403)
        assert_problem(await user.post("/v1/policies", at_most_two_gpus(my_tenant)), 403)
        seen = {p["id"] for p in (await admin.get("/v1/policies")).body["items"]}
        assert {their_policy["id"], provider["id"]} <= seen
        only = (await admin.get(f"/v1/policies?tenant_id={their_tenant}")).body["items"]
        assert [p["id"] for p in only] == [their_policy["id"]]
        # another tenant's policy never judges this tenant's members
        assert (await user.post("/v1/allocations", alloc(shape="vm.4gpu", spot=True))).status == 202


async def test_a_policy_change_applies_within_a_second_on_another_replica(gateway):
    first, second = await gateway(), await gateway()
    tenant_admin, tenant_id = await first.tenant_user("tenant_admin")
    user, _ = await first.new_user(tenant_id)
    user.http = second.http                                    # the user talks to the other replica
    tenant_admin_there = type(tenant_admin)(second.http, tenant_admin.token)
    ask = {"operation": "createAllocation", "resource": {
        "name": "a", "shape": "vm.4gpu", "gpu_count": 4, "pool": "shared", "image_approved": True, "spot": False,
        "privileged": False, "priority_class": "normal"}}

    async def allowed_there() -> bool:
        return (await tenant_admin_there.post("/v1/policies/evaluate", ask)).body["allowed"]

    assert await allowed_there()                               # the second replica has compiled its policies
    created = await tenant_admin.post("/v1/policies", at_most_two_gpus(tenant_id))
    assert created.status == 201
    await eventually(allowed_there, until=lambda a: a is False, timeout=APPLIES_WITHIN_S,
                     what="the second replica to apply the new policy")
    assert assert_problem(await user.post("/v1/allocations", alloc(shape="vm.4gpu")), 403)["policy_id"] == \
        created.body["id"]
    assert (await tenant_admin.delete(f"/v1/policies/{created.body['id']}")).status == 204
    await eventually(allowed_there, timeout=APPLIES_WITHIN_S, what="the second replica to drop the deleted policy")
    assert (await user.post("/v1/allocations", alloc(shape="vm.4gpu"))).status == 202
