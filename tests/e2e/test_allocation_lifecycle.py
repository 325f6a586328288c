"""Through the gateway, with every service running as its own process."""
from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest

from shared.participant import FAULT_LABEL
from tests.support.platform import NOTHING_LEFT, leftovers
from tests.support.polling import eventually
from tooling.client import ApiError, WaitAborted

# activate too: an allocation refused at its activation was never metered (billing meters activations)
ALLOCATE_STEPS = ["reserve_slots", "attach_network", "provision_volume", "provision_node", "activate"]


async def test_allocation_goes_active_then_released_and_leaves_nothing_behind(tenant, db):
    a = await tenant.user.create_allocation("train-1", shape="vm.2gpu", volume_gb=50)
    assert a["state"] == "REQUESTED"
    active = await tenant.user.wait_state(a["id"], "ACTIVE", timeout=60)
    assert active["node_id"]
    left = await leftovers(db, a["id"])
    assert left["slots"] == 2 and left["attachments"] == 1 and left["volumes"] == 1
    assert left["instances"] == 1 and left["running_meters"] == 1
    await tenant.user.release(a["id"])
    released = await tenant.user.wait_state(a["id"], "RELEASED", timeout=60)
    assert released["state"] == "RELEASED"
    assert await leftovers(db, a["id"]) == dict.fromkeys(left, 0)
    gpu_seconds = await db.fetchval("SELECT gpu_seconds FROM billing.meters WHERE allocation_id=$1", uuid.UUID(a["id"]))
    assert gpu_seconds is not None and gpu_seconds >= 0


@pytest.mark.parametrize("step", ALLOCATE_STEPS)
async def test_fault_at_each_step_fails_the_allocation_and_compensates_every_earlier_step(tenant, db, step):
    a = await tenant.user.create_allocation(f"fault-{step}", shape="vm.1gpu", volume_gb=10,
                                            labels={FAULT_LABEL: f"{step}=fail"})
    failed = await tenant.user.wait_state(a["id"], {"FAILED", "ACTIVE"}, timeout=60)
    assert failed["state"] == "FAILED"
    assert failed["failed_step"] == step
    assert "injected fault" in failed["reason"]
    assert await leftovers(db, a["id"]) == NOTHING_LEFT


async def test_a_wait_for_active_stops_as_soon_as_the_allocation_fails_and_says_where_and_why(tenant):
    a = await tenant.user.create_allocation("doomed", shape="vm.1gpu", labels={FAULT_LABEL: "provision_node=fail"})
    started = time.monotonic()
    with pytest.raises(WaitAborted) as exc:
        await tenant.user.wait_state(a["id"], "ACTIVE", timeout=240)
    assert time.monotonic() - started < 60, "it stopped when the allocation failed, not at the timeout"
    assert exc.value.last["state"] == "FAILED" and exc.value.last["failed_step"] == "provision_node"
    assert "FAILED at provision_node" in str(exc.value) and "injected fault" in str(exc.value)


async def test_step_that_never_answers_times_out_and_is_compensated(tenant, db):
    a = await tenant.user.create_allocation("hang", shape="vm.1gpu", volume_gb=10,
                                            labels={FAULT_LABEL: "provision_node=timeout"})
    failed = await tenant.user.wait_state(a["id"], {"FAILED", "ACTIVE"}, timeout=90)
    assert failed["state"] == "FAILED" and failed["failed_step"] == "provision_node"
    assert "timed out" in failed["reason"]
    assert await leftovers(db, a["id"]) == NOTHING_LEFT


async def test_no_capacity_with_fail_fast_fails_at_reservation_with_nothing_reserved(tenant, db):
    # 2 shared nodes × 8 GPUs: ask for more whole nodes than fit, refusing to wait in the queue
    ids = [(await tenant.user.create_allocation(f"big-{i}", shape="bm.8gpu", fail_fast=True))["id"] for i in range(3)]
    states = [await tenant.user.wait_state(i, {"ACTIVE", "FAILED"}, timeout=60) for i in ids]
    failed = [s for s in states if s["state"] == "FAILED"]
    assert failed, "three whole-node allocations cannot all fit on two nodes (plus other tests' allocations)"
    assert all(s["failed_step"] == "reserve_slots" and "capacity" in s["reason"] for s in failed)
    for s in states:
        if s["state"] == "ACTIVE":
            await tenant.user.release(s["id"])
    for s in states:
        if s["state"] == "ACTIVE":
            await tenant.user.wait_state(s["id"], "RELEASED", timeout=60)


async def test_same_idempotency_key_serially_and_concurrently_creates_one_allocation(tenant, db):
    key = uuid.uuid4().hex
    first = await tenant.user.create_allocation("idem", idempotency_key=key)
    again = await tenant.user.create_allocation("idem", idempotency_key=key)
    assert again["id"] == first["id"]
    key2 = uuid.uuid4().hex
    results = await asyncio.gather(*(tenant.user.create_allocation("idem-c", idempotency_key=key2) for _ in range(10)))
    assert len({r["id"] for r in results}) == 1
    # the allocation service may lag the gateway: wait until both requests have arrived there
    query = "SELECT count(*) FROM allocation.allocations WHERE tenant_id=$1 AND name IN ('idem', 'idem-c')"
    count = await eventually(lambda: db.fetchval(query, uuid.UUID(tenant.id)), until=lambda n: n == 2, timeout=15,
                             what="both requests at the allocation service")
    assert count == 2


async def test_another_tenants_allocation_is_404_and_never_listed(make_tenant):
    a, b = await make_tenant(), await make_tenant()
    mine = await a.user.create_allocation("private")
    with pytest.raises(ApiError) as exc:
        await b.user.allocation(mine["id"])
    assert exc.value.status == 404
    with pytest.raises(ApiError) as exc:
        await b.user.release(mine["id"])
    assert exc.value.status == 404
    listed = (await b.user.allocations(limit=100))["items"]
    assert mine["id"] not in {x["id"] for x in listed}
    assert mine["id"] in {x["id"] for x in (await a.admin.allocations(limit=100))["items"]}


async def test_tenant_user_cannot_call_provider_admin_endpoints(tenant):
    for method, path, body in [("POST", "/v1/tenants", {"name": "x"}), ("GET", "/v1/tenants", None),
                               ("POST", "/v1/nodes", {"name": "n", "gpu_model": "H100", "gpu_count": 8}),
                               ("GET", "/v1/ops/dead-letters", None)]:
        with pytest.raises(ApiError) as exc:
            await tenant.user.request(method, path, json_body=body)
        assert exc.value.status == 403, (method, path)
        assert exc.value.problem["status"] == 403


@pytest.mark.parametrize("body, content_type, status", [
    (b'{"name": "x", "shape": ', "application/json", 400),                              # bad JSON
    (json.dumps({"name": "x", "shape": "vm.1gpu", "volume_gb": "lots"}).encode(), "application/json", 422),  # wrong type
    (json.dumps({"name": "x", "shape": "vm.1gpu", "colour": "red"}).encode(), "application/json", 422),     # unknown field
    (json.dumps({"name": "x", "shape": "vm.1gpu", "state": "ACTIVE"}).encode(), "application/json", 422),   # server-owned
    (json.dumps({"name": "x", "shape": "vm.1gpu", "tenant_id": str(uuid.uuid4())}).encode(), "application/json", 422),
    (json.dumps({"name": "x", "shape": "vm.1gpu", "labels": {"k": "v" * 70000}}).encode(), "application/json", 413),  # oversized
    (b"name=x", "application/x-www-form-urlencoded", 415),
])
async def test_malformed_allocation_requests_get_problem_json_and_create_nothing(tenant, db, body, content_type, status):
    before = await db.fetchval("SELECT count(*) FROM gateway.allocations_view WHERE tenant_id=$1", uuid.UUID(tenant.id))
    headers = {"Authorization": f"Bearer {await tenant.user.token()}", "Content-Type": content_type}
    async with tenant.user.session.post(tenant.user.base_url + "/v1/allocations", data=body, headers=headers) as r:
        assert r.status == status
        assert r.headers["Content-Type"].startswith("application/problem+json")
        problem = await r.json(content_type=None)
        assert problem["status"] == status and problem["title"]
    after = await db.fetchval("SELECT count(*) FROM gateway.allocations_view WHERE tenant_id=$1", uuid.UUID(tenant.id))
    assert after == before
    assert await db.fetchval("SELECT count(*) FROM allocation.allocations WHERE tenant_id=$1", uuid.UUID(tenant.id)) == 0


async def test_watching_an_allocation_streams_its_own_events(tenant):
    a = await tenant.user.create_allocation("watched", shape="vm.1gpu")
    # each message type has its own consumer, so the stream is in arrival order, not causal order:
    # wait until every expected event has come, whatever their order
    expected = {"allocation.requested", "scheduler.slots_reserved", "allocation.activated"}
    seen: list[str] = []

    async def follow(until: set[str]):
        seen.clear()
        async for env in tenant.user.events(a["id"]):
            assert env["correlation_id"] == a["id"]
            seen.append(env["type"])
            if until <= set(seen):
                return

    await asyncio.wait_for(follow(expected), timeout=60)
    assert all(seen.count(t) == 1 for t in seen if t.startswith("allocation."))   # each state change once
    await tenant.user.wait_state(a["id"], "ACTIVE")
    await tenant.user.release(a["id"])
    await tenant.user.wait_state(a["id"], "RELEASED")
    # replayed once the release is over (long after the allocate saga's last message): nothing went wrong, so the
    # sagas published no saga.step_changed (that is only for timeouts, retries, give-ups and skips)
    await asyncio.wait_for(follow(expected | {"allocation.release_requested", "allocation.released"}), timeout=60)
    assert "saga.step_changed" not in seen


async def test_an_allocation_deleted_while_provisioning_is_released_once_active_or_ends_failed(
        platform, admin, tenant, db):
    """As Nova deletes a server still building: a DELETE while PROVISIONING is a 202 that keeps the state and
    shows when the release was asked; the allocation goes ACTIVE and on to RELEASED by itself. One whose
    provisioning then fails ends FAILED, its steps undone, nothing released twice."""
    pool = f"slow-{uuid.uuid4().hex[:6]}"
    await admin.define_pool(pool)
    await platform.add_node(f"{pool}-0", pool=pool, env={"TESSERA_SIM_LATENCY_S": "provision=2"})
    await admin.set_quota(tenant.id, pool, "H100", 8)
    a = await tenant.user.create_allocation("short-lived", shape="vm.1gpu", volume_gb=10, pool=pool)
    await tenant.user.wait_state(a["id"], "PROVISIONING", timeout=30)
    asked = await tenant.user.release(a["id"])
    assert asked["state"] == "PROVISIONING" and asked["release_requested_at"]
    released = await tenant.user.wait_state(a["id"], "RELEASED", timeout=60)
    assert released["release_requested_at"] == asked["release_requested_at"]
    assert await leftovers(db, a["id"]) == NOTHING_LEFT
    doomed = await tenant.user.create_allocation("doomed", shape="vm.1gpu", pool=pool,
                                                 labels={FAULT_LABEL: "provision_node=timeout"})
    await tenant.user.wait_state(doomed["id"], "PROVISIONING", timeout=30)
    assert (await tenant.user.release(doomed["id"]))["release_requested_at"]
    with pytest.raises(WaitAborted) as failed:
        await tenant.user.wait_state(doomed["id"], "RELEASED", timeout=60)
    assert failed.value.last["state"] == "FAILED" and failed.value.last["failed_step"] == "provision_node"
    assert await leftovers(db, doomed["id"]) == NOTHING_LEFT
