"""The gateway's read model: allocation.* events move allocations_view forward only; SSE replays and streams."""
from __future__ import annotations

import json
import uuid

from tests.support.gateway import PROJECTED_WITHIN_S, SseReader, publish
from tests.support.polling import eventually

AT = "2030-01-01T00:00:00Z"


def activated(a: dict, node_id: uuid.UUID) -> dict:
    saga = uuid.uuid4()
    return {"allocation_id": a["id"], "tenant_id": a["tenant_id"], "state": "ACTIVE", "at": AT, "saga_id": saga,
            "step": "activate", "idempotency_key": f"{saga}:activate", "node_id": node_id}


def slots_reserved(a: dict, saga: uuid.UUID, node_id: uuid.UUID) -> dict:
    """The scheduler's placement: the allocation is PROVISIONING on ``node_id``."""
    return {"saga_id": saga, "step": "reserve_slots", "idempotency_key": f"{saga}:reserve_slots",
            "allocation_id": a["id"], "node_id": node_id, "slots": [0, 1], "gpu_model": "H100"}


async def recorded(api, env) -> bool:
    return bool(await api.scalar("SELECT 1 FROM allocation_events WHERE event_id=$1", env.id))


async def test_activated_event_makes_get_show_active_and_a_late_placement_does_not_move_it_back(api, nc):
    client, _ = await api.tenant_user()
    a = (await client.post("/v1/allocations", {"name": "p1", "shape": "vm.4gpu"})).body
    node = uuid.uuid4()
    await publish(nc, "allocation.activated", activated(a, node), a["tenant_id"])

    async def state():
        r = await client.get(f"/v1/allocations/{a['id']}")
        return r.body if r.body["state"] == "ACTIVE" else None
    shown = await eventually(state, timeout=PROJECTED_WITHIN_S)
    assert shown["node_id"] == str(node)
    late = await publish(nc, "scheduler.slots_reserved", slots_reserved(a, uuid.uuid4(), node), a["tenant_id"])
    await eventually(lambda: recorded(api, late), timeout=PROJECTED_WITHIN_S)
    assert (await client.get(f"/v1/allocations/{a['id']}")).body["state"] == "ACTIVE"


async def test_failed_event_records_step_and_reason_and_is_terminal(api, nc):
    client, _ = await api.tenant_user()
    a = (await client.post("/v1/allocations", {"name": "p2", "shape": "vm.1gpu"})).body
    await publish(nc, "allocation.failed",
                  {"allocation_id": a["id"], "tenant_id": a["tenant_id"], "state": "FAILED", "at": AT,
                   "failed_step": "reserve_slots", "reason": "no capacity"}, a["tenant_id"])

    async def failed():
        r = await client.get(f"/v1/allocations/{a['id']}")
        return r.body if r.body["state"] == "FAILED" else None
    shown = await eventually(failed, timeout=PROJECTED_WITHIN_S)
    assert shown["failed_step"] == "reserve_slots" and shown["reason"] == "no capacity"
    late = await publish(nc, "allocation.activated", activated(a, uuid.uuid4()), a["tenant_id"])
    await eventually(lambda: recorded(api, late), timeout=PROJECTED_WITHIN_S)
    assert (await client.get(f"/v1/allocations/{a['id']}")).body["state"] == "FAILED"


async def test_release_events_take_the_allocation_to_released(api, nc):
    client, _ = await api.tenant_user()
    a = (await client.post("/v1/allocations", {"name": "p3", "shape": "vm.1gpu"})).body
    await publish(nc, "allocation.activated", activated(a, uuid.uuid4()), a["tenant_id"])
    saga = uuid.uuid4()
    # released may overtake release_requested; the view still ends RELEASED
    await publish(nc, "allocation.released",
                  {"allocation_id": a["id"], "tenant_id": a["tenant_id"], "state": "RELEASED", "at": AT, "saga_id": saga,
                   "step": "mark_released", "idempotency_key": f"{saga}:mark_released"}, a["tenant_id"])
    rr = await publish(nc, "allocation.release_requested",
                       {"allocation_id": a["id"], "tenant_id": a["tenant_id"], "state": "RELEASING", "at": AT,
                        "requested_by": uuid.uuid4()}, a["tenant_id"])
    await eventually(lambda: recorded(api, rr), timeout=PROJECTED_WITHIN_S)

    async def released():
        return (await client.get(f"/v1/allocations/{a['id']}")).body["state"] == "RELEASED"
    await eventually(released, timeout=PROJECTED_WITHIN_S)
    assert (await client.delete(f"/v1/allocations/{a['id']}")).status == 202


async def test_allocation_requested_from_elsewhere_appears_in_the_tenants_list(api, nc):
    client, tenant_id = await api.tenant_user()
    allocation_id = str(uuid.uuid4())
    await publish(nc, "allocation.requested",
                  {"allocation_id": allocation_id, "tenant_id": tenant_id, "state": "REQUESTED", "at": AT,
                   "user_id": uuid.uuid4(), "name": "elsewhere", "shape": "vm.8gpu", "gpu_count": 8, "volume_gb": 0}, tenant_id)

    async def listed():
        return allocation_id in {i["id"] for i in (await client.get("/v1/allocations")).body["items"]}
    await eventually(listed, timeout=PROJECTED_WITHIN_S)


async def test_event_stream_replays_stored_events_then_delivers_live_ones(api, nc):
    client, _ = await api.tenant_user()
    a = (await client.post("/v1/allocations", {"name": "sse", "shape": "vm.2gpu"})).body
    saga = uuid.uuid4()
    stored = await publish(nc, "scheduler.slots_reserved", slots_reserved(a, saga, uuid.uuid4()), a["tenant_id"])
    await eventually(lambda: recorded(api, stored), timeout=PROJECTED_WITHIN_S)
    async with client.http.get(a["links"]["events"], headers={"Authorization": f"Bearer {client.token}"}) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
        sse = SseReader(resp)
        first = await sse.next_event()
        assert first["id"] == str(stored.id) and first["event"] == "scheduler.slots_reserved"
        assert json.loads(first["data"])["data"]["saga_id"] == str(saga)
        # live: a saga step (the stream polls only every 30 s here, so this arrives through NOTIFY)
        step = await publish(nc, "saga.step_changed",
                             {"saga_id": saga, "kind": "allocate", "allocation_id": a["id"], "step": "reserve_slots",
                              "status": "succeeded", "attempt": 1}, a["tenant_id"])
        second = await sse.next_event(timeout=10)
        assert second["id"] == str(step.id) and second["event"] == "saga.step_changed"
        live = await publish(nc, "allocation.activated", activated(a, uuid.uuid4()), a["tenant_id"])
        third = await sse.next_event(timeout=10)
        assert third["id"] == str(live.id) and json.loads(third["data"])["type"] == "allocation.activated"
    # a reconnect with Last-Event-ID resumes after that event
    headers = {"Authorization": f"Bearer {client.token}", "Last-Event-ID": str(step.id)}
    async with client.http.get(a["links"]["events"], headers=headers) as resp:
        assert (await SseReader(resp).next_event())["id"] == str(live.id)


async def test_node_registration_is_sent_to_the_scheduler_and_shows_registered_once_confirmed(api, nc, watch):
    admin = await api.admin()
    commands = await watch("scheduler.cmd.register_node")
    name = f"node-{uuid.uuid4().hex[:8]}"
    r = await admin.post("/v1/nodes", {"name": name, "gpu_model": "H100", "gpu_count": 8, "labels": {"rack": "r1"}})
    assert r.status == 202 and r.body["status"] == "registering" and r.body["labels"] == {"rack": "r1"}
    node_id = r.body["id"]
    hits = await commands.wait_for(lambda i: i[1]["data"]["node_id"] == node_id)
    assert hits[0][1]["data"]["gpu_count"] == 8 and hits[0][1]["data"]["name"] == name
    assert (await admin.post("/v1/nodes", {"name": name, "gpu_model": "H100", "gpu_count": 8})).status == 409
    await publish(nc, "scheduler.node_registered", {"node_id": node_id, "name": name, "gpu_model": "H100", "gpu_count": 8})

    async def registered():
        nodes = {n["id"]: n for n in (await admin.get("/v1/nodes")).body["items"]}
        return nodes.get(node_id, {}).get("status") == "registered"
    await eventually(registered, timeout=PROJECTED_WITHIN_S)
