"""The gateway's pure scheduling rules: the allocation order with QUEUED, usable shapes, the quota fast-fail,
shape definitions, priority classes, tolerations and the request/response models (no I/O)."""
from __future__ import annotations

import uuid

import pytest
from pydantic import ValidationError

from services.gateway.adapters.admission import QuotaExceeded
from services.gateway.api.allocations.schemas import AllocationCreate
from services.gateway.api.inventory.node_schemas import NodePatch, SlotMapApproval
from services.gateway.api.inventory.pool_schemas import PoolDefinition
from services.gateway.api.inventory.quota_schemas import TenantQuotaSet, UserQuotaSet
from services.gateway.api.inventory.quotas import quota_list
from services.gateway.api.inventory.shape_schemas import ShapeDefinition
from services.gateway.domain.model import advances, advances_to
from services.gateway.domain.scheduling import (
    BUILTIN_SHAPES,
    NIL,
    PRIORITY_CLASSES,
    QuotaRow,
    ShapeInfo,
    priority_class_of,
    quota_breach,
    shape_definition_errors,
    usable_shapes,
    valid_toleration,
)

T, U = uuid.uuid4(), uuid.uuid4()


# --- the allocation order ----------------------------------------------------------------------------

def test_queued_comes_after_the_saga_start_and_before_reserved_slots():
    assert advances("REQUESTED", "QUEUED") and advances("PROVISIONING", "QUEUED")
    assert not advances("QUEUED", "PROVISIONING")                       # a late saga start
    assert advances_to("QUEUED", False, "PROVISIONING", True)           # slots reserved
    assert not advances_to("PROVISIONING", True, "QUEUED")              # a late queued reply
    assert not advances_to("PROVISIONING", True, "PROVISIONING", True)  # a duplicate
    assert advances_to("PROVISIONING", False, "PROVISIONING", True)
    for state in ("ACTIVE", "FAILED"):
        assert advances("QUEUED", state) and advances_to("PROVISIONING", True, state)
    for later in ("ACTIVE", "RELEASING", "RELEASED", "FAILED"):
        assert not advances_to(later, False, "QUEUED") and not advances_to(later, True, "PROVISIONING", True)


# --- shapes ------------------------------------------------------------------------------------------

def test_built_in_shapes_serve_only_while_the_catalog_holds_no_document():
    assert usable_shapes([]) == BUILTIN_SHAPES and BUILTIN_SHAPES["bm.8gpu"].kind == "bare_metal"
    mig = ShapeInfo("mig.1g", "mig", 1, "H100", "1g.10gb", version=1)
    gone = ShapeInfo("vm.1gpu", "vm", 1, deleted=True, version=2)
    assert usable_shapes([mig, gone]) == {"mig.1g": mig}
    assert usable_shapes([gone]) == {}    # a deleted default is not resurrected


@pytest.mark.parametrize("kind,count,profile,fields", [
    ("vm", 2, None, []), ("vm", 3, None, ["gpu_count"]), ("vm", 1, "1g.10gb", ["mig_profile"]),
    ("mig", 1, "1g.10gb", []), ("mig", 2, None, ["gpu_count", "mig_profile"]), ("bare_metal", 8, None, []),
])
def test_shape_definitions_follow_the_kind_rules(kind, count, profile, fields):
    assert [f for f, _ in shape_definition_errors(kind, count, profile)] == fields


# --- quota fast-fail ---------------------------------------------------------------------------------

def _breach(rows, *, model="H100", pool_models=(), requested=2):
    return quota_breach(rows, tenant_id=T, user_id=U, pool="shared", gpu_model=model, pool_models=pool_models,
                        requested=requested)


def test_quota_boundary_is_exact_and_no_row_means_not_limited():
    assert _breach([QuotaRow("H100", NIL, 4, 2)]) is None                       # 2 left, 2 asked
    b = _breach([QuotaRow("H100", NIL, 4, 3)])
    assert (b.quota, b.limit, b.used, b.requested) == (f"tenant {T} H100 in pool shared", 4, 3, 2)
    assert _breach([QuotaRow("A100", NIL, 0, 0)]) is None                       # another model's quota
    assert _breach([]) is None
    assert _breach([QuotaRow("H100", NIL, 2, 5)], requested=1).used == 5        # lowered below use: blocks


def test_a_users_split_is_checked_after_the_tenants_own_quota():
    b = _breach([QuotaRow("H100", NIL, 8, 0), QuotaRow("H100", U, 2, 1)])
    assert b.quota == f"tenant {T} H100 in pool shared for user {U}" and b.limit == 2
    assert _breach([QuotaRow("H100", NIL, 2, 2), QuotaRow("H100", U, 2, 1)]).quota.endswith("pool shared")


def test_a_shape_for_any_model_is_refused_only_when_every_model_of_the_pool_is_over_quota():
    full = [QuotaRow("H100", NIL, 2, 2)]
    assert _breach(full, model=None, pool_models=["H100", "A100"]) is None
    assert _breach(full, model=None, pool_models=["H100"]).quota.startswith(f"tenant {T} H100")
    both = full + [QuotaRow("A100", NIL, 1, 0)]
    assert _breach(both, model=None, pool_models=["H100", "A100", "H100"]).quota == f"tenant {T} A100 in pool shared"
    assert _breach(full, model=None, pool_models=[]) is None                    # unknown models: left to the scheduler


def test_quota_exceeded_problem_carries_its_members():
    b = _breach([QuotaRow("H100", NIL, 4, 3)])
    problem = QuotaExceeded(b).to_problem("/v1/allocations").model_dump(exclude_none=True)
    assert problem["status"] == 403 and problem["type"].endswith("/quota-exceeded")
    assert (problem["quota"], problem["limit"], problem["used"], problem["requested"]) == (b.quota, 4, 3, 2)


def test_quota_list_groups_the_tenants_row_with_its_users_splits():
    rows = [{"pool": "shared", "gpu_model": "H100", "user_id": NIL, "limit": 8, "guaranteed": 2, "used": 3, "version": 4},
            {"pool": "shared", "gpu_model": "H100", "user_id": U, "limit": 2, "guaranteed": 0, "used": 1, "version": 1},
            {"pool": "gpu-a", "gpu_model": "A100", "user_id": U, "limit": 1, "guaranteed": 0, "used": 0, "version": 1}]
    items = quota_list(T, rows).items
    assert [(q.pool, q.gpu_model, q.limit) for q in items] == [("gpu-a", "A100", None), ("shared", "H100", 8)]
    assert [(u.user_id, u.limit, u.used) for u in items[1].users] == [(U, 2, 1)]


# --- request models ----------------------------------------------------------------------------------

def test_priority_classes_map_to_priorities_and_back():
    assert PRIORITY_CLASSES == {"low": -100, "normal": 0, "high": 100}
    assert [priority_class_of(p) for p in (-100, 0, 100, 7)] == ["low", "normal", "high", None]


def test_allocation_body_scheduling_defaults_and_checks():
    a = AllocationCreate.model_validate({"name": "a", "shape": "mig.1g.10gb"})
    assert (a.priority_class, a.spot, a.pool, a.tolerations, a.fail_fast, a.network_id) == ("normal", False, None, [],
                                                                                              False, None)
    net = uuid.uuid4()
    assert AllocationCreate.model_validate({"name": "a", "shape": "vm.1gpu", "network_id": str(net)}).network_id == net
    for bad in ({"priority_class": "urgent"}, {"tolerations": ["x"] * 17}, {"tolerations": ["gpu=a:Evict"]},
                {"pool": "UPPER"}, {"fail_fast": 1}, {"priority": 5}):
        with pytest.raises(ValidationError):
            AllocationCreate.model_validate({"name": "a", "shape": "vm.1gpu", **bad})


def test_tolerations_name_a_key_a_value_and_no_schedule():
    assert valid_toleration("spot=true:NoSchedule") and valid_toleration("dedicated/tenant=a:NoSchedule")
    for bad in ("spot", "spot=true", "spot=true:NoExecute", "=x:NoSchedule", "a b=c:NoSchedule"):
        assert not valid_toleration(bad), bad


@pytest.mark.parametrize("model,body", [
    (SlotMapApproval, {"proposal": 0}), (SlotMapApproval, {"proposal": 1, "wipe_policy": "x" * 65}),
    (NodePatch, {"taints": {"k": "v"}}), (NodePatch, {"pool": "-bad"}),
    (PoolDefinition, {"policy": "fill"}), (ShapeDefinition, {"kind": "vm", "gpu_count": 0}),
    (TenantQuotaSet, {"limit": -1}), (UserQuotaSet, {"limit": 1, "guaranteed": 1}),
])
def test_inventory_bodies_refuse_invalid_values(model, body):
    with pytest.raises(ValidationError):
        model.model_validate(body)


@pytest.mark.parametrize("model", [SlotMapApproval, NodePatch, PoolDefinition, ShapeDefinition, TenantQuotaSet,
                                   UserQuotaSet])
def test_server_owned_fields_are_never_client_fields(model):
    assert model.server_owned and not model.server_owned & set(model.model_fields)
