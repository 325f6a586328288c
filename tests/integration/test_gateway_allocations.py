"""Allocations through the gateway: request (idempotent), tenant isolation, pagination, release."""
from __future__ import annotations

import asyncio
import uuid
from functools import partial

from tests.support.bus import publish_event
from tests.support.gateway import PROJECTED_WITHIN_S, project
from tests.support.polling import eventually


def body(**over) -> dict:
    b = {"name": f"a-{uuid.uuid4().hex[:8]}", "shape": "vm.2gpu", "volume_gb": 50, "labels": {"team": "ml"}}
    b.update(over)
    return b


async def activate(api, nc, client, allocation_id: str, tenant_id: str) -> None:
    """Play the allocation service: publish allocation.activated and wait until the gateway shows ACTIVE."""
    saga = uuid.uuid4()
    data = {"allocation_id": allocation_id, "tenant_id": tenant_id, "state": "ACTIVE", "at": "2030-01-01T00:00:00Z",
            "saga_id": saga, "step": "activate", "idempotency_key": f"{saga}:activate", "node_id": uuid.uuid4()}
    await publish_event(nc.jetstream(), "allocation.activated", data, tenant_id=tenant_id)

    async def active():
        return (await client.get(f"/v1/allocations/{allocation_id}")).body["state"] == "ACTIVE"
    await eventually(active, timeout=PROJECTED_WITHIN_S)


async def test_post_allocation_answers_202_and_sends_one_request_command_with_the_trace(api, watch):
    client, tenant_id = await api.tenant_user()
    commands = await watch("allocation.cmd.request")
    trace_id = uuid.uuid4().hex
    r = await client.post("/v1/allocations", body(name="train-1"), headers={"traceparent": f"00-{trace_id}-{'1' * 16}-01"})
    assert r.status == 202, r.body
    a = r.body
    assert a["state"] == "REQUESTED" and a["gpu_count"] == 2 and a["volume_gb"] == 50 and a["labels"] == {"team": "ml"}
    assert a["tenant_id"] == tenant_id and a["name"] == "train-1" and a["shape"] == "vm.2gpu"
    assert r.headers["Location"] == f"/v1/allocations/{a['id']}" == a["links"]["self"]
    hits = await commands.wait_for(lambda i: i[1]["data"]["allocation_id"] == a["id"])
    env = hits[0][1]
    assert env["type"] == "allocation.request" and env["correlation_id"] == a["id"] and env["tenant_id"] == tenant_id
    assert env["data"]["gpu_count"] == 2 and env["data"]["labels"] == {"team": "ml"}
    assert env["traceparent"].split("-")[1] == trace_id   # the request's trace continues into the saga
    got = await client.get(a["links"]["self"])
    assert got.status == 200 and got.body["id"] == a["id"] and got.body["state"] == "REQUESTED"


async def test_another_tenant_gets_404_and_never_sees_the_allocation(api):
    alice, _ = await api.tenant_user()
    bob, _ = await api.tenant_user("tenant_admin")
    a = (await alice.post("/v1/allocations", body())).body
    for method in ("GET", "DELETE"):
        r = await bob.call(method, f"/v1/allocations/{a['id']}")
        assert r.status == 404 and r.content_type == "application/problem+json", (method, r.body)
    assert (await bob.get(f"/v1/allocations/{a['id']}/events")).status == 404
    assert (await bob.get(f"/v1/allocations/{uuid.uuid4()}")).status == 404
    assert (await bob.get("/v1/allocations/not-a-uuid")).status == 404
    assert a["id"] not in {i["id"] for i in (await bob.get("/v1/allocations?limit=100")).body["items"]}
    assert a["id"] in {i["id"] for i in (await alice.get("/v1/allocations")).body["items"]}


async def test_same_idempotency_key_and_body_replays_the_same_202_without_a_second_allocation(api):
    client, tenant_id = await api.tenant_user()
    key, b = f"k-{uuid.uuid4()}", body()
    first = await client.post("/v1/allocations", b, headers={"Idempotency-Key": key})
    again = await client.post("/v1/allocations", dict(reversed(list(b.items()))), headers={"Idempotency-Key": key})
    assert first.status == again.status == 202
    assert again.body == first.body and again.headers["Location"] == first.headers["Location"]
    assert await api.scalar("SELECT count(*) FROM allocations_view WHERE tenant_id=$1", uuid.UUID(tenant_id)) == 1
    assert await api.commands_of("allocation.request", tenant_id) == 1
    # without the header, the same body is a new allocation
    assert (await client.post("/v1/allocations", b)).body["id"] != first.body["id"]


async def test_reusing_an_idempotency_key_with_another_body_is_422_and_creates_nothing(api):
    client, tenant_id = await api.tenant_user()
    key = f"k-{uuid.uuid4()}"
    assert (await client.post("/v1/allocations", body(name="one"), headers={"Idempotency-Key": key})).status == 202
    r = await client.post("/v1/allocations", body(name="two"), headers={"Idempotency-Key": key})
    assert r.status == 422 and r.content_type == "application/problem+json"
    assert r.body["errors"][0]["field"] == "Idempotency-Key"
    assert await api.scalar("SELECT count(*) FROM allocations_view WHERE tenant_id=$1", uuid.UUID(tenant_id)) == 1


async def test_twenty_concurrent_posts_with_one_key_make_exactly_one_allocation_and_one_command(api, watch):
    client, tenant_id = await api.tenant_user()
    commands = await watch("allocation.cmd.request")
    key, b = f"k-{uuid.uuid4()}", body()
    replies = await asyncio.gather(*(client.post("/v1/allocations", b, headers={"Idempotency-Key": key}) for _ in range(20)))
    assert {r.status for r in replies} == {202}
    ids = {r.body["id"] for r in replies}
    assert len(ids) == 1 and all(r.body == replies[0].body for r in replies)
    assert sum(r.headers.get("Idempotent-Replayed") == "true" for r in replies) == 19
    assert await api.scalar("SELECT count(*) FROM allocations_view WHERE tenant_id=$1", uuid.UUID(tenant_id)) == 1
    assert await api.commands_of("allocation.request", tenant_id) == 1
    await commands.wait_for(lambda i: i[1]["tenant_id"] == tenant_id)
    # the relay has published every outbox row once nothing is pending; only one command is there
    await eventually(lambda: api.scalar("SELECT count(*) = 0 FROM outbox WHERE published_at IS NULL"), timeout=15)
    assert len([i for i in commands.items if i[1]["tenant_id"] == tenant_id]) == 1


async def test_pagination_returns_every_allocation_once_newest_first(api):
    client, _ = await api.tenant_user()
    created = [(await client.post("/v1/allocations", body(name=f"p-{n}"))).body["id"] for n in range(7)]
    seen, cursor, pages = [], None, 0
    while True:
        r = await client.get("/v1/allocations?limit=3" + (f"&cursor={cursor}" if cursor else ""))
        assert r.status == 200 and len(r.body["items"]) <= 3
        seen += [i["id"] for i in r.body["items"]]
        pages += 1
        cursor = r.body["next_cursor"]
        if cursor is None:
            break
    assert pages == 3
    assert seen == list(reversed(created))
    assert (await client.get("/v1/allocations?cursor=garbage")).status == 422
    assert (await client.get("/v1/allocations?limit=0")).status == 422
    assert (await client.get("/v1/allocations?limit=abc")).status == 422


async def provisioning(nc, client, allocation_id: str, tenant_id: str) -> None:
    """Play the scheduler: publish scheduler.slots_reserved (the allocate saga's placement) and wait until the
    gateway shows the allocation PROVISIONING."""
    saga = uuid.uuid4()
    data = {"saga_id": saga, "step": "reserve_slots", "idempotency_key": f"{saga}:reserve_slots",
            "allocation_id": allocation_id, "node_id": uuid.uuid4(), "slots": [0, 1], "gpu_model": "H100"}
    await publish_event(nc.jetstream(), "scheduler.slots_reserved", data, tenant_id=tenant_id)

    async def shown():
        return (await client.get(f"/v1/allocations/{allocation_id}")).body["state"] == "PROVISIONING"
    await eventually(shown, timeout=PROJECTED_WITHIN_S)


async def test_release_of_an_active_allocation_is_sent_once(api, nc, watch):
    client, tenant_id = await api.tenant_user()
    releases = await watch("allocation.cmd.release")
    a = (await client.post("/v1/allocations", body())).body
    await activate(api, nc, client, a["id"], tenant_id)
    first = await client.delete(f"/v1/allocations/{a['id']}")
    assert first.status == 202 and first.body["state"] == "RELEASING"
    second = await client.delete(f"/v1/allocations/{a['id']}")
    assert second.status == 202 and second.body["state"] == "RELEASING"
    hits = await releases.wait_for(lambda i: i[1]["data"]["allocation_id"] == a["id"])
    assert hits[0][1]["data"]["tenant_id"] == tenant_id
    assert await api.commands_of("allocation.release", tenant_id) == 1


async def test_a_provisioning_allocation_is_withdrawn_once_and_not_released_again_once_active(api, nc, watch):
    """As Nova deletes a server still building: the DELETE of a PROVISIONING allocation is a 202 that sends one
    saga.withdraw (the coordinator releases it once ACTIVE) and shows when it was asked; a DELETE again, even
    once the allocation shows ACTIVE, sends nothing more (the release is the coordinator's to send)."""
    client, tenant_id = await api.tenant_user()
    withdrawals = await watch("saga.cmd.withdraw")
    a = (await client.post("/v1/allocations", body())).body
    await provisioning(nc, client, a["id"], tenant_id)
    first = await client.delete(f"/v1/allocations/{a['id']}")
    assert first.status == 202 and first.body["state"] == "PROVISIONING" and first.body["release_requested_at"]
    hits = await withdrawals.wait_for(lambda i: i[1]["data"]["allocation_id"] == a["id"])
    assert hits[0][1]["data"]["tenant_id"] == tenant_id
    await activate(api, nc, client, a["id"], tenant_id)
    again = await client.delete(f"/v1/allocations/{a['id']}")
    assert again.status == 202 and again.body["release_requested_at"] == first.body["release_requested_at"]
    assert await api.commands_of("saga.withdraw", tenant_id) == 1
    assert await api.commands_of("allocation.release", tenant_id) == 0
    failed = (await client.post("/v1/allocations", body())).body      # a FAILED allocation has nothing to release
    await publish_event(nc.jetstream(), "allocation.failed", {
        "allocation_id": failed["id"], "tenant_id": tenant_id, "state": "FAILED", "at": "2030-01-01T00:00:00Z",
        "failed_step": "reserve_slots", "reason": "no capacity"}, tenant_id=tenant_id)

    async def shown_failed() -> bool:
        return (await client.get(f"/v1/allocations/{failed['id']}")).body["state"] == "FAILED"
    await eventually(shown_failed, timeout=PROJECTED_WITHIN_S)
    refused = await client.delete(f"/v1/allocations/{failed['id']}")
    assert refused.status == 409 and refused.content_type == "application/problem+json"


async def test_concurrent_releases_send_one_command(api, nc):
    client, tenant_id = await api.tenant_user()
    a = (await client.post("/v1/allocations", body())).body
    await activate(api, nc, client, a["id"], tenant_id)
    replies = await asyncio.gather(*(client.delete(f"/v1/allocations/{a['id']}") for _ in range(8)))
    assert {r.status for r in replies} == {202}
    assert await api.commands_of("allocation.release", tenant_id) == 1



async def test_an_allocation_that_left_its_tenants_line_shows_no_place_not_even_one_told_late(api, nc):
    """Its saga started: the place goes, and a place told before it left but handled after (another consumer's
    message) is not shown again."""
    client, tenant_id = await api.tenant_user()
    a = (await client.post("/v1/allocations", body())).body
    waiting = {"allocation_id": a["id"], "tenant_id": tenant_id, "reason": "tenant_line"}

    async def shown() -> tuple:
        got = (await client.get(f"/v1/allocations/{a['id']}")).body
        return got["state"], got.get("queue_position"), got.get("queued_reason")
    await project(api, nc, "saga.allocation_waiting", waiting | {"position": 2}, tenant_id)
    assert await shown() == ("REQUESTED", 2, "tenant_line")
    await project(api, nc, "saga.allocation_left_line", {"allocation_id": a["id"], "tenant_id": tenant_id}, tenant_id)
    assert await shown() == ("REQUESTED", None, None)
    await project(api, nc, "saga.allocation_waiting", waiting | {"position": 1}, tenant_id)   # told earlier, handled late
    assert await shown() == ("REQUESTED", None, None)
    assert await api.scalar("SELECT count(*) FROM allocation_events WHERE allocation_id=$1 "   # on its event stream
                            "AND type='saga.allocation_left_line'", uuid.UUID(a["id"])) == 1

async def test_a_requested_allocation_shows_its_place_in_its_tenants_line_and_release_withdraws_it_once(api, nc, watch):
    client, tenant_id = await api.tenant_user()
    withdrawals = await watch("saga.cmd.withdraw")
    a = (await client.post("/v1/allocations", body())).body

    async def told(position: int) -> None:
        await publish_event(nc.jetstream(), "saga.allocation_waiting", {
            "allocation_id": a["id"], "tenant_id": tenant_id, "position": position, "reason": "tenant_line"},
            tenant_id=tenant_id)

    async def place() -> tuple:
        got = (await client.get(f"/v1/allocations/{a['id']}")).body
        return got["state"], got.get("queue_position"), got.get("queued_reason")

    async def shows(expected: tuple) -> bool:
        return await place() == expected
    await told(3)
    await eventually(partial(shows, ("REQUESTED", 3, "tenant_line")), timeout=PROJECTED_WITHIN_S)
    listed = (await client.get("/v1/allocations")).body["items"]
    assert [(i["queue_position"], i["queued_reason"]) for i in listed if i["id"] == a["id"]] == [(3, "tenant_line")]
    await told(2)
    await eventually(partial(shows, ("REQUESTED", 2, "tenant_line")), timeout=PROJECTED_WITHIN_S)
    assert await api.scalar("SELECT count(*) FROM allocation_events WHERE allocation_id=$1 "   # on its event stream
                            "AND type='saga.allocation_waiting'", uuid.UUID(a["id"])) == 2

    first = await client.delete(f"/v1/allocations/{a['id']}")
    second = await client.delete(f"/v1/allocations/{a['id']}")
    assert (first.status, second.status) == (202, 202)
    hits = await withdrawals.wait_for(lambda i: i[1]["data"]["allocation_id"] == a["id"])
    assert hits[0][1]["data"]["tenant_id"] == tenant_id
    assert await api.commands_of("saga.withdraw", tenant_id) == 1
    assert await api.commands_of("allocation.release", tenant_id) == 0
    await publish_event(nc.jetstream(), "allocation.release_requested", {
        "allocation_id": a["id"], "tenant_id": tenant_id, "state": "RELEASING", "at": "2030-01-01T00:00:00Z",
        "node_id": None}, tenant_id=tenant_id)
    await eventually(partial(shows, ("RELEASING", None, None)), timeout=PROJECTED_WITHIN_S)
