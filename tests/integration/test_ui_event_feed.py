"""GET /v1/events: the tenant's event feed over real NATS and PostgreSQL (live, scoped, filtered, resumable)."""
from __future__ import annotations

import json
import uuid

from services.gateway.adapters import event_feed
from services.gateway.adapters.event_feed import FeedFilter
from services.gateway.api.events.feed import FeedReader
from tests.support.gateway import SseReader, assert_problem, publish


def rejected(a: dict) -> dict:
    """An allocation event that leaves the view's state as it is (a refused release)."""
    return {"allocation_id": a["id"], "command": "allocation.release", "reason": "the allocation is REQUESTED"}


def step(a: dict) -> dict:
    return {"saga_id": uuid.uuid4(), "kind": "allocate", "allocation_id": a["id"], "step": "reserve_slots",
            "status": "succeeded", "attempt": 1}


def feed(client, query: str = "", headers: dict | None = None):
    return client.http.get(f"/v1/events{query}", headers={"Authorization": f"Bearer {client.token}", **(headers or {})})


async def test_a_tenant_sees_its_own_events_live_and_never_another_tenants(api, nc):
    alice, _ = await api.tenant_user()
    bob, _ = await api.tenant_user()
    a = (await alice.post("/v1/allocations", {"name": "mine", "shape": "vm.2gpu"})).body
    b = (await bob.post("/v1/allocations", {"name": "theirs", "shape": "vm.2gpu"})).body
    async with feed(alice) as resp:   # the poll interval is 30 s here: what arrives comes through NOTIFY
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
        sse = SseReader(resp)
        await publish(nc, "allocation.command_rejected", rejected(b), b["tenant_id"])
        mine = await publish(nc, "allocation.command_rejected", rejected(a), a["tenant_id"])
        got = await sse.next_event()
        data = json.loads(got["data"])
        assert got["event"] == "allocation.command_rejected" and got["id"] == str(data["seq"])
        assert data["allocation_id"] == a["id"] and data["tenant_id"] == a["tenant_id"]
        assert data["envelope"]["id"] == str(mine.id) and data["type"] == "allocation.command_rejected"
        later = await publish(nc, "saga.step_changed", step(a), a["tenant_id"])
        second = await sse.next_event()
        assert json.loads(second["data"])["envelope"]["id"] == str(later.id) and int(second["id"]) > int(got["id"])
    # resuming after the first replays the second, then nothing of bob's
    async with feed(alice, headers={"Last-Event-ID": got["id"]}) as resp:
        assert json.loads((await SseReader(resp).next_event())["data"])["envelope"]["id"] == str(later.id)
    async with feed(alice, f"?after={got['id']}&type=allocation.") as resp:   # the type filter skips the step
        await publish(nc, "allocation.command_rejected", rejected(a), a["tenant_id"])
        assert json.loads((await SseReader(resp).next_event())["data"])["type"] == "allocation.command_rejected"


async def test_the_provider_admin_sees_every_tenant_and_may_narrow_to_one(api, nc):
    admin = await api.admin()
    alice, _ = await api.tenant_user()
    bob, _ = await api.tenant_user()
    a = (await alice.post("/v1/allocations", {"name": "x", "shape": "vm.2gpu"})).body
    b = (await bob.post("/v1/allocations", {"name": "y", "shape": "vm.2gpu"})).body
    async with feed(admin) as every, feed(admin, f"?tenant_id={b['tenant_id']}") as bobs:
        await publish(nc, "allocation.command_rejected", rejected(a), a["tenant_id"])
        await publish(nc, "allocation.command_rejected", rejected(b), b["tenant_id"])
        everyone, only_bob = SseReader(every), SseReader(bobs)
        seen = {json.loads((await everyone.next_event())["data"])["tenant_id"] for _ in range(2)}
        assert seen == {a["tenant_id"], b["tenant_id"]}
        assert json.loads((await only_bob.next_event())["data"])["allocation_id"] == b["id"]


async def test_a_tenant_may_not_name_another_tenant_or_its_allocation(api):
    alice, _ = await api.tenant_user()
    bob, bob_tenant = await api.tenant_user()
    b = (await bob.post("/v1/allocations", {"name": "z", "shape": "vm.2gpu"})).body
    assert_problem(await alice.get(f"/v1/events?tenant_id={bob_tenant}"), 403)
    assert_problem(await alice.get(f"/v1/events?allocation_id={b['id']}"), 404)
    assert_problem(await alice.get("/v1/events?after=-1"), 422, "after")
    assert_problem(await api.anonymous().get("/v1/events"), 401)


async def test_an_event_committed_after_a_newer_one_is_still_delivered(api):
    """Two projections commit out of seq order: the reader, already past the later seq, delivers the earlier."""
    client, tenant_id = await api.tenant_user()
    a = (await client.post("/v1/allocations", {"name": "late", "shape": "vm.2gpu"})).body
    async with feed(client) as resp:
        sse = SseReader(resp)
        async with api.rt.pool.acquire() as slow, api.rt.pool.acquire() as fast:
            tx = slow.transaction()
            await tx.start()
            early_seq = await _append(slow, a["id"], tenant_id, "test.early")
            late_seq = await _append(fast, a["id"], tenant_id, "test.late")
            assert (await sse.next_event())["id"] == str(late_seq)
            await tx.commit()
        assert (await sse.next_event())["id"] == str(early_seq)


async def _append(conn, allocation_id: str, tenant_id: str, type_: str) -> int:
    envelope = json.dumps({"id": str(uuid.uuid4()), "type": type_, "tenant_id": tenant_id})
    return await conn.fetchval(
        "WITH added AS (INSERT INTO allocation_events (event_id, allocation_id, type, envelope) "
        "VALUES ($1, $2, $3, $4::jsonb) RETURNING seq) SELECT seq FROM added, pg_notify('gateway_allocation_events', $5)",
        uuid.uuid4(), uuid.UUID(allocation_id), type_, envelope, allocation_id)


async def test_an_event_committed_between_the_readers_two_queries_is_still_delivered(api, monkeypatch):
    """The reader reads the events of its range, then which seqs of it are committed: an earlier seq committing
    between the two must be awaited as a gap (one snapshot for both), never counted as seen and lost."""
    client, tenant_id = await api.tenant_user()
    a = (await client.post("/v1/allocations", {"name": "racy", "shape": "vm.2gpu"})).body
    async with api.rt.pool.acquire() as reader_conn, api.rt.pool.acquire() as slow, api.rt.pool.acquire() as fast:
        reader = await FeedReader.start(reader_conn, FeedFilter(uuid.UUID(tenant_id)), None)
        tx = slow.transaction()
        await tx.start()
        early_seq = await _append(slow, a["id"], tenant_id, "test.early")
        late_seq = await _append(fast, a["id"], tenant_id, "test.late")
        events_between = event_feed.events_between

        async def then_commit(*args, **kw):   # the earlier insert commits right after the events were read
            rows = await events_between(*args, **kw)
            if not then_commit.done:
                then_commit.done = True
                await tx.commit()
            return rows
        then_commit.done = False
        monkeypatch.setattr(event_feed, "events_between", then_commit)
        first, _ = await reader.read(reader_conn)
        assert [r["seq"] for r in first] == [late_seq]
        second, _ = await reader.read(reader_conn)
        assert [r["seq"] for r in second] == [early_seq]
