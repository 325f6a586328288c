"""Allocations whose node failed, as their tenant sees them through the gateway: INTERRUPTED with why and what
next, then ACTIVE again on another node with the gap, in either order of the two events, and both events in the
allocation's event stream (the allocation service is played by publishing its events)."""
from __future__ import annotations

import json
import uuid

from tests.support.gateway import PROJECTED_WITHIN_S, SseReader, project, publish
from tests.support.polling import eventually

AT = "2030-01-01T00:00:00Z"
LOST_AT = "2030-01-01T01:00:00Z"


async def active_allocation(api, nc, node: uuid.UUID):
    client, _ = await api.tenant_user()
    a = (await client.post("/v1/allocations", {"name": "job", "shape": "vm.4gpu"})).body
    saga = uuid.uuid4()
    await project(api, nc, "allocation.activated",
                  {"allocation_id": a["id"], "tenant_id": a["tenant_id"], "state": "ACTIVE", "at": AT, "saga_id": saga,
                   "step": "activate", "idempotency_key": f"{saga}:activate", "node_id": node}, a["tenant_id"])
    return client, a


def interrupted(a: dict, node: uuid.UUID, attempt: int = 1) -> dict:
    return {"allocation_id": a["id"], "tenant_id": a["tenant_id"], "state": "INTERRUPTED", "at": LOST_AT,
            "node_id": node, "category": "gpu_fault", "reason": "a GPU of its node failed (xid 79)",
            "interrupted_at": LOST_AT, "next": "it is being placed on another node", "attempt": attempt,
            "user_id": str(uuid.uuid4()), "shape": "vm.4gpu", "gpu_count": 4, "volume_gb": 0}


def rescheduled(a: dict, lost: uuid.UUID, to: uuid.UUID, attempt: int = 1) -> dict:
    return {"allocation_id": a["id"], "tenant_id": a["tenant_id"], "state": "ACTIVE", "at": "2030-01-01T01:02:00Z",
            "from_node_id": lost, "to_node_id": to, "interrupted_at": LOST_AT, "gap_s": 120.0, "attempt": attempt}


async def test_an_interrupted_allocation_shows_why_then_where_it_was_rescheduled_and_its_tenant_sees_both(api, nc):
    lost, to = uuid.uuid4(), uuid.uuid4()
    client, a = await active_allocation(api, nc, lost)
    got_interrupted = await project(api, nc, "allocation.interrupted", interrupted(a, lost), a["tenant_id"])
    shown = (await client.get(f"/v1/allocations/{a['id']}")).body
    assert shown["state"] == "INTERRUPTED" and shown["node_id"] == str(lost)
    cut = shown["interruption"]
    assert (cut["category"], cut["node_id"], cut["attempt"], cut["rescheduled"]) == ("gpu_fault", str(lost), 1, False)
    assert cut["next"] == "it is being placed on another node" and "xid 79" in cut["reason"]
    assert a["id"] in {x["id"] for x in (await client.get("/v1/allocations")).body["items"]}
    got_rescheduled = await project(api, nc, "allocation.rescheduled", rescheduled(a, lost, to), a["tenant_id"])
    shown = (await client.get(f"/v1/allocations/{a['id']}")).body
    assert shown["state"] == "ACTIVE" and shown["node_id"] == str(to)
    cut = shown["interruption"]
    assert (cut["from_node_id"], cut["to_node_id"], cut["gap_s"], cut["rescheduled"]) == (str(lost), str(to), 120.0, True)
    assert cut["category"] == "gpu_fault"   # the interruption is kept once rescheduled
    headers = {"Authorization": f"Bearer {client.token}"}
    async with client.http.get(a["links"]["events"], headers=headers) as resp:
        sse, seen = SseReader(resp), []
        while str(got_rescheduled.id) not in [e["id"] for e in seen]:
            seen.append(await sse.next_event())
    kinds = {e["event"]: json.loads(e["data"]) for e in seen}
    assert kinds["allocation.interrupted"]["id"] == str(got_interrupted.id)
    assert kinds["allocation.rescheduled"]["data"]["to_node_id"] == str(to)


async def test_a_release_asked_while_interrupted_is_sent_and_a_later_reschedule_does_not_undo_it(api, nc, watch):
    lost, to = uuid.uuid4(), uuid.uuid4()
    client, a = await active_allocation(api, nc, lost)
    await project(api, nc, "allocation.interrupted", interrupted(a, lost), a["tenant_id"])
    sent = await watch("allocation.cmd.release")
    r = await client.delete(f"/v1/allocations/{a['id']}")   # kept by the allocation service until it is placed again
    assert r.status == 202 and r.body["state"] == "RELEASING"
    await sent.wait_for(lambda i: i[1]["data"]["allocation_id"] == a["id"])
    await project(api, nc, "allocation.rescheduled", rescheduled(a, lost, to), a["tenant_id"])
    assert (await client.get(f"/v1/allocations/{a['id']}")).body["state"] == "RELEASING"


async def test_a_reschedule_arriving_before_its_interruption_leaves_the_allocation_active(api, nc):
    lost, to = uuid.uuid4(), uuid.uuid4()
    client, a = await active_allocation(api, nc, lost)
    await project(api, nc, "allocation.rescheduled", rescheduled(a, lost, to), a["tenant_id"])
    await project(api, nc, "allocation.interrupted", interrupted(a, lost), a["tenant_id"])
    shown = (await client.get(f"/v1/allocations/{a['id']}")).body
    assert (shown["state"], shown["node_id"]) == ("ACTIVE", str(to))
    cut = shown["interruption"]
    assert (cut["rescheduled"], cut["category"], cut["to_node_id"]) == (True, "gpu_fault", str(to))
    # a second failure (attempt 2) interrupts it again; a late event of attempt 1 changes nothing
    await project(api, nc, "allocation.interrupted", interrupted(a, to, attempt=2), a["tenant_id"])
    late = await publish(nc, "allocation.rescheduled", rescheduled(a, lost, to), a["tenant_id"])
    await eventually(lambda: api.handled(late), timeout=PROJECTED_WITHIN_S)
    shown = (await client.get(f"/v1/allocations/{a['id']}")).body
    assert (shown["state"], shown["interruption"]["attempt"], shown["interruption"]["node_id"]) == (
        "INTERRUPTED", 2, str(to))
