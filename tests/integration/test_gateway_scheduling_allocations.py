"""Allocations meet the scheduler through the gateway: scheduling options passed on, shapes checked against the
catalog, QUEUED shown and cancelled, placement, refusals with their problem, preemption notices and reasons."""
from __future__ import annotations

import uuid

from tests.support.gateway import ensure_default_shapes, project

AT = "2030-01-01T00:00:00Z"


def reply(a: dict, **data) -> dict:
    saga = data.pop("saga_id", uuid.uuid4())
    return {"saga_id": saga, "step": "reserve_slots", "idempotency_key": f"{saga}:reserve_slots",
            "allocation_id": a["id"], **data}


async def shown(client, a: dict) -> dict:
    return (await client.get(f"/v1/allocations/{a['id']}")).body


async def queued(api, nc, client, tenant_id: str, position: int = 3) -> dict:
    a = (await client.post("/v1/allocations", {"name": f"q-{uuid.uuid4().hex[:6]}", "shape": "vm.8gpu"})).body
    await project(api, nc, "scheduler.reservation_queued", reply(a, tenant_id=tenant_id, position=position,
                                                                 reason="no node has 8 free GPUs"), tenant_id)
    return a


async def test_scheduling_options_are_passed_to_the_allocation_service_and_shown(api, watch):
    client, _ = await api.tenant_user()
    commands = await watch("allocation.cmd.request")
    network_id = str(uuid.uuid4())
    body = {"name": "prio", "shape": "vm.4gpu", "priority_class": "high", "spot": True, "pool": "spot-pool",
            "tolerations": ["spot=true:NoSchedule"], "fail_fast": True, "network_id": network_id}
    r = await client.post("/v1/allocations", body)
    assert r.status == 202, r.body
    a = r.body
    assert (a["priority_class"], a["priority"], a["spot"], a["pool"], a["fail_fast"], a["network_id"]) == (
        "high", 100, True, "spot-pool", True, network_id)
    hits = await commands.wait_for(lambda i: i[1]["data"]["allocation_id"] == a["id"])
    sent = hits[0][1]["data"]
    assert (sent["priority"], sent["spot"], sent["pool"], sent["tolerations"], sent["fail_fast"], sent["network_id"],
            sent["gpu_count"]) == (100, True, "spot-pool", ["spot=true:NoSchedule"], True, network_id, 4)
    assert (await shown(client, a))["tolerations"] == ["spot=true:NoSchedule"]
    low = (await client.post("/v1/allocations", {"name": "low", "shape": "vm.1gpu", "priority_class": "low"})).body
    assert low["priority"] == -100 and low["spot"] is False and low["pool"] is None


async def test_bad_scheduling_options_and_unknown_shapes_are_422_and_create_nothing(api, nc):
    await ensure_default_shapes(api, nc)
    client, tenant_id = await api.tenant_user()
    deleted = f"gone-{uuid.uuid4().hex[:6]}"
    await project(api, nc, "scheduler.shape_changed", {"name": deleted, "kind": "vm", "gpu_count": 1, "deleted": True,
                                                       "version": 2}, tenant_id)
    cases = [({"priority_class": "urgent"}, "priority_class"), ({"priority": 100}, "priority"),
             ({"tolerations": ["spot"]}, "tolerations.0"), ({"network_id": "not-a-uuid"}, "network_id"),
             ({"pool": "Bad Pool"}, "pool"), ({"spot": "yes"}, "spot"), ({"shape": "vm.3gpu"}, "shape"),
             ({"shape": deleted}, "shape")]
    for over, field in cases:
        r = await client.post("/v1/allocations", {"name": "x", "shape": "vm.1gpu", **over})
        assert r.status == 422 and field in {e["field"] for e in r.body["errors"]}, (over, r.body)
    r = await client.post("/v1/allocations", {"name": "x", "shape": "vm.3gpu"})
    assert "vm.1gpu" in r.body["detail"] and deleted not in r.body["detail"]
    assert await api.scalar("SELECT count(*) FROM allocations_view WHERE tenant_id=$1", uuid.UUID(tenant_id)) == 0
    assert await api.commands_of("allocation.request", tenant_id) == 0


async def test_a_catalog_shape_fixes_the_gpu_count_of_the_request(api, nc, watch):
    await ensure_default_shapes(api, nc)
    client, tenant_id = await api.tenant_user()
    name = f"h100x2-{uuid.uuid4().hex[:6]}"
    await project(api, nc, "scheduler.shape_changed", {"name": name, "kind": "vm", "gpu_count": 2, "gpu_model": "H100",
                                                       "version": 1}, tenant_id)
    r = await client.post("/v1/allocations", {"name": "cat", "shape": name})
    assert r.status == 202 and r.body["gpu_count"] == 2 and r.body["shape"] == name


async def test_a_queued_request_shows_its_place_and_a_late_place_in_its_tenants_line_does_not_move_it_back(api, nc):
    client, tenant_id = await api.tenant_user()
    a = await queued(api, nc, client, tenant_id, position=3)
    doc = await shown(client, a)
    assert (doc["state"], doc["queue_position"], doc["queued_reason"]) == ("QUEUED", 3, "no node has 8 free GPUs")
    await project(api, nc, "saga.allocation_waiting", {"allocation_id": a["id"], "tenant_id": tenant_id,
                                                       "position": 1}, tenant_id)
    doc = await shown(client, a)
    assert (doc["state"], doc["queue_position"], doc["queued_reason"]) == ("QUEUED", 3, "no node has 8 free GPUs")
    events = [e["event"] for e in await _stored_events(api, a)]
    assert events.index("scheduler.reservation_queued") < events.index("saga.allocation_waiting")


async def _stored_events(api, a: dict) -> list[dict]:
    async with api.rt.pool.acquire() as conn:
        rows = await conn.fetch("SELECT type FROM allocation_events WHERE allocation_id=$1 ORDER BY seq", uuid.UUID(a["id"]))
    return [{"event": r["type"]} for r in rows]


async def test_reserved_slots_take_a_queued_allocation_to_provisioning_and_a_late_queued_is_ignored(api, nc):
    client, tenant_id = await api.tenant_user()
    a = await queued(api, nc, client, tenant_id)
    node = uuid.uuid4()
    await project(api, nc, "scheduler.slots_reserved", reply(a, node_id=node, slots=[0, 1, 2, 3, 4, 5, 6, 7],
                                                             gpu_model="H100", waited_s=12.5), tenant_id)
    doc = await shown(client, a)
    assert (doc["state"], doc["node_id"], doc["queue_position"]) == ("PROVISIONING", str(node), None)
    await project(api, nc, "scheduler.reservation_queued", reply(a, tenant_id=tenant_id, position=1, reason="late"),
                  tenant_id)
    assert (await shown(client, a))["state"] == "PROVISIONING"


async def test_deleting_a_queued_allocation_cancels_it_once_and_it_ends_failed_cancelled(api, nc, watch):
    client, tenant_id = await api.tenant_user()
    cancels = await watch("scheduler.cmd.cancel_request")
    a = await queued(api, nc, client, tenant_id)
    first = await client.delete(f"/v1/allocations/{a['id']}")
    again = await client.delete(f"/v1/allocations/{a['id']}")
    assert first.status == again.status == 202 and first.body["state"] == "QUEUED"
    hits = await cancels.wait_for(lambda i: i[1]["data"]["allocation_id"] == a["id"])
    assert hits[0][1]["data"]["tenant_id"] == tenant_id
    assert await api.commands_of("scheduler.cancel_request", tenant_id) == 1
    assert await api.commands_of("allocation.release", tenant_id) == 0
    await project(api, nc, "scheduler.slot_reservation_failed", reply(a, reason="cancelled by the tenant",
                                                                      code="cancelled"), tenant_id)
    doc = await shown(client, a)
    assert (doc["state"], doc["failed_step"], doc["problem"]["code"]) == ("FAILED", "reserve_slots", "cancelled")


async def test_a_quota_refusal_by_the_scheduler_fails_the_allocation_with_the_quota_members(api, nc):
    client, tenant_id = await api.tenant_user()
    a = (await client.post("/v1/allocations", {"name": "race", "shape": "vm.2gpu"})).body
    await project(api, nc, "allocation.failed", {"allocation_id": a["id"], "tenant_id": tenant_id, "state": "FAILED",
                                                 "at": AT, "failed_step": "reserve_slots", "reason": "quota"}, tenant_id)
    quota = f"tenant {tenant_id} H100 in pool shared"
    # arriving after the saga's FAILED, the refusal's details are still recorded
    await project(api, nc, "scheduler.slot_reservation_failed", reply(
        a, reason="quota exceeded", code="quota-exceeded", quota=quota, limit=4, used=3, requested=2), tenant_id)
    doc = await shown(client, a)
    assert doc["state"] == "FAILED" and doc["problem"] == {"code": "quota-exceeded", "reason": "quota exceeded",
                                                           "quota": quota, "limit": 4, "used": 3, "requested": 2}


async def test_a_preemption_notice_is_shown_and_the_release_reason_recorded(api, nc):
    client, tenant_id = await api.tenant_user()
    a = (await client.post("/v1/allocations", {"name": "spot", "shape": "vm.1gpu", "spot": True})).body
    saga, node = uuid.uuid4(), uuid.uuid4()
    await project(api, nc, "allocation.activated", {"allocation_id": a["id"], "tenant_id": tenant_id, "state": "ACTIVE",
                                                    "at": AT, "saga_id": saga, "step": "activate",
                                                    "idempotency_key": f"{saga}:activate", "node_id": node}, tenant_id)
    winner = uuid.uuid4()
    await project(api, nc, "scheduler.preemption_notice", {"allocation_id": a["id"], "tenant_id": tenant_id,
                                                           "node_id": node, "reason": "spot capacity reclaimed",
                                                           "preempted_for": winner, "grace_deadline": AT}, tenant_id)
    doc = await shown(client, a)
    assert doc["state"] == "ACTIVE" and doc["preemption"]["reason"] == "spot capacity reclaimed"
    assert doc["preemption"]["preempted_for"] == str(winner) and doc["preemption"]["grace_deadline"].startswith("2030-01-01")
    await project(api, nc, "allocation.release_requested", {"allocation_id": a["id"], "tenant_id": tenant_id,
                                                            "state": "RELEASING", "at": AT,
                                                            "reason": "preempted: spot capacity reclaimed"}, tenant_id)
    doc = await shown(client, a)
    assert (doc["state"], doc["reason"]) == ("RELEASING", "preempted: spot capacity reclaimed")
