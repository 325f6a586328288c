"""Quotas and concurrency against real PostgreSQL: the exact boundary, a lowered quota, a tenant admin's
per-user split, and hundreds of concurrent claims (from separate connections, and from two scheduler
replicas consuming at once) that never give a slot twice nor exceed a quota, checked with SQL."""
from __future__ import annotations

import asyncio
import random
import uuid

import asyncpg

from services.scheduler.adapters import claims
from services.scheduler.bootstrap import build
from services.scheduler.settings import SchedulerSettings
from tests.support.bus import send_command as send
from tests.support.concurrency import run_concurrently
from tests.support.polling import eventually
from tests.support.scheduler import start


async def test_quota_admits_exactly_up_to_its_limit_and_names_quota_limit_and_use_beyond(run_service, nc, watch):
    env = await start(run_service, nc, watch)
    tenant = uuid.uuid4()
    quota = await env.grant(tenant, 4)
    assert (quota["limit"], quota["used"]) == (4, 0)
    await env.onboard()
    assert (await env.reserve(tenant, "vm.2gpu"))["type"] == "scheduler.slots_reserved"
    assert (await env.reserve(tenant, "vm.2gpu"))["type"] == "scheduler.slots_reserved"
    over = (await env.reserve(tenant, "vm.1gpu"))["data"]
    assert over["code"] == "quota-exceeded" and (over["limit"], over["used"], over["requested"]) == (4, 4, 1)
    assert over["quota"] == f"tenant/{tenant}/H100/{env.pool}" and over["quota"] in over["reason"]


async def test_a_tenant_without_a_quota_may_not_allocate_and_a_lowered_quota_evicts_nothing(run_service, nc, watch):
    env = await start(run_service, nc, watch)
    await env.onboard()
    stranger = await env.reserve(uuid.uuid4(), "vm.1gpu")
    assert stranger["data"]["code"] == "quota-exceeded" and stranger["data"]["limit"] is None
    tenant = uuid.uuid4()
    await env.grant(tenant, 8)
    running = await env.reserve(tenant, "vm.4gpu")
    lowered = await env.grant(tenant, 2)
    assert (lowered["limit"], lowered["used"]) == (2, 4)
    blocked = await env.reserve(tenant, "vm.1gpu")
    assert blocked["data"]["code"] == "quota-exceeded" and blocked["data"]["used"] == 4
    assert len(await env.held(uuid.UUID(running["data"]["allocation_id"]))) == 4


async def test_a_users_split_of_the_tenant_quota_is_enforced_for_requests_naming_the_user(run_service, nc, watch):
    env = await start(run_service, nc, watch)
    tenant, user = uuid.uuid4(), uuid.uuid4()
    await env.grant(tenant, 8)
    split = await env.grant(tenant, 2, user=user)
    assert split["user_id"] == str(user)
    await env.onboard()
    assert (await env.reserve(tenant, "vm.2gpu", user_id=user))["type"] == "scheduler.slots_reserved"
    over = (await env.reserve(tenant, "vm.1gpu", user_id=user))["data"]
    assert over["code"] == "quota-exceeded" and over["quota"].endswith(f"/user/{user}") and over["limit"] == 2
    other = await env.reserve(tenant, "vm.2gpu", user_id=uuid.uuid4())
    assert other["type"] == "scheduler.slots_reserved"
    async with env.rt.pool.acquire() as conn:
        assert await conn.fetchval("SELECT used FROM quotas WHERE tenant_id=$1 AND user_id=$2", tenant, user) == 2
        assert await conn.fetchval("SELECT used FROM quotas WHERE tenant_id=$1 AND user_id=$2", tenant, claims.NIL) == 4


async def _assert_no_double_booking_nor_overrun(conn: asyncpg.Connection, pool: str) -> None:
    """The invariants, from SQL alone: every held slot belongs to an allocations row that lists it, each
    slot at most once, and every quota's use equals what its tenant holds and stays within its limit."""
    listed = await conn.fetch("SELECT a.allocation_id, unnest(a.slots) AS idx, a.node_id FROM allocations a "
                              "WHERE a.pool=$1", pool)
    held = await conn.fetch("SELECT s.allocation_id, s.idx, s.node_id FROM slots s JOIN nodes n ON n.id = s.node_id "
                            "WHERE n.pool=$1 AND s.allocation_id IS NOT NULL", pool)
    assert sorted(map(tuple, listed)) == sorted(map(tuple, held))
    assert len({(r["node_id"], r["idx"]) for r in listed}) == len(listed)
    rows = await conn.fetch(
        'SELECT q.tenant_id, q."limit", q.used, coalesce((SELECT sum(gpus) FROM allocations a WHERE '
        "a.tenant_id = q.tenant_id AND a.pool = q.pool AND a.gpu_model = q.gpu_model), 0) AS holds "
        "FROM quotas q WHERE q.pool=$1 AND q.user_id=$2", pool, claims.NIL)
    for r in rows:
        assert r["used"] == r["holds"] <= r["limit"], dict(r)


def _use_of(tenant: uuid.UUID, used: int):
    """A predicate: a ``quota_use_changed`` naming the tenant's quota at ``used``."""
    return lambda i: i[1]["type"] == "scheduler.quota_use_changed" and any(
        q["tenant_id"] == str(tenant) and q["used"] == used for q in i[1]["data"]["quotas"])


async def test_a_quotas_use_is_published_once_coalesced_and_marked_sent(run_service, nc, watch):
    """Reservations do not each send an event: the leader's loop sends the quota's use once it changed
    (``quota_use_changed``) and marks the version sent, so it is not sent again until it changes."""
    env = await start(run_service, nc, watch)
    tenant = uuid.uuid4()
    await env.grant(tenant, 8)
    await env.onboard()
    for _ in range(2):
        assert (await env.reserve(tenant, "vm.2gpu"))["type"] == "scheduler.slots_reserved"
    *_, sent = await env.events.wait_for(_use_of(tenant, 4))
    [doc] = [q for q in sent[1]["data"]["quotas"] if q["tenant_id"] == str(tenant)]
    async with env.rt.pool.acquire() as conn:
        row = await conn.fetchrow("SELECT version, published FROM quotas WHERE tenant_id=$1", tenant)
    assert row["published"] == row["version"] == doc["version"]


async def test_many_quotas_use_goes_out_in_a_few_messages_of_at_most_the_contracts_size(run_service, nc, watch):
    """Three hundred quotas whose use changed at once are two ``quota_use_changed`` (256 + 44), not three
    hundred events; each quota once, each row then marked sent."""
    env = await start(run_service, nc, watch)
    tenants = [uuid.uuid4() for _ in range(300)]
    async with env.rt.pool.acquire() as conn:
        await conn.execute('INSERT INTO quotas (tenant_id, gpu_model, pool, "limit", used, version, published) '
                           "SELECT t, 'H100', $2, 8, 3, 2, 1 FROM unnest($1::uuid[]) AS t", tenants, env.pool)
    wanted = {str(t) for t in tenants}

    def naming(hits) -> list[dict]:
        return [q for h in hits for q in h[1]["data"]["quotas"] if q["tenant_id"] in wanted]

    hits = await eventually(lambda: [i for i in env.events.items if i[1]["type"] == "scheduler.quota_use_changed"
                                     and wanted & {q["tenant_id"] for q in i[1]["data"]["quotas"]}],
                            until=lambda hits: len(naming(hits)) >= 300, timeout=20,
                            what="quota_use_changed naming the 300 quotas")
    assert len(hits) == 2 and max(len(h[1]["data"]["quotas"]) for h in hits) == 256
    assert sorted(q["tenant_id"] for q in naming(hits)) == sorted(wanted)
    assert all((q["used"], q["version"]) == (3, 2) for q in naming(hits))
    async with env.rt.pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM quotas WHERE tenant_id = ANY($1) AND published = version",
                                   tenants) == 300


async def test_two_hundred_concurrent_claims_from_separate_connections_never_share_a_slot_or_overrun(
        run_service, provision, nc, watch):
    env = await start(run_service, nc, watch)
    tenants = [uuid.uuid4() for _ in range(4)]
    for t in tenants:
        await env.grant(t, 9)                       # 4 tenants x 9 GPUs = 36 < 40 slots: quota binds too
    nodes = [await env.onboard() for _ in range(5)]
    rng = random.Random(7)
    wanted = [claims.Claim(uuid.uuid4(), rng.choice(tenants), None, node, tuple(sorted(rng.sample(range(8), k))),
                           f"vm.{k}gpu", "H100", env.pool, k)
              for node in (rng.choice(nodes) for _ in range(200)) for k in [rng.choice((1, 2))]]

    async def claim(conn: asyncpg.Connection, c: claims.Claim) -> str:
        try:
            async with conn.transaction():
                await claims.claim(conn, c)
            return "claimed"
        except claims.SlotTaken:
            return "taken"
        except claims.QuotaExceeded:
            return "quota"

    results = await run_concurrently(await provision("scheduler"), wanted, claim)
    assert results.count("claimed") > 0 and results.count("taken") > 0
    async with env.rt.pool.acquire() as conn:
        await _assert_no_double_booking_nor_overrun(conn, env.pool)
        assert await conn.fetchval("SELECT count(*) FROM allocations WHERE pool=$1", env.pool) == results.count("claimed")


async def test_two_replicas_deciding_at_once_give_each_slot_once_and_respect_the_quota(run_service, nc, watch):
    """Election off (a split brain): both replicas consume and decide from their own index; SQL alone
    must keep the invariants. The second replica starts after onboarding, so both know the nodes. The two
    quotas add up to the 16 GPUs: whatever order the requests are served in, each tenant's quota binds."""
    both = SchedulerSettings(leader_election=False, preemption_grace_s=0.5, stats_s=5, burn_in=False)
    env = await start(run_service, nc, watch, scheduler=both)
    small, big = uuid.uuid4(), uuid.uuid4()
    await env.grant(small, 5)
    await env.grant(big, 11)
    for _ in range(2):
        await env.onboard()
    second = await run_service("scheduler", lambda s: build(s, both), instance="1")
    await asyncio.wait_for(second.leadership.leading.wait(), 30)
    cmds = [env.reserve_cmd(t, "vm.1gpu", fail_fast=True) for t in [small] * 40 + [big] * 40]
    random.Random(3).shuffle(cmds)
    await asyncio.gather(*(send(env.js, "scheduler.reserve_slots", c) for c in cmds))
    replies = [await env.reply(c["allocation_id"], timeout=60) for c in cmds]
    placed = [r["data"] for r in replies if r["type"] == "scheduler.slots_reserved"]
    assert len(placed) == 16 and len({(p["node_id"], p["slots"][0]) for p in placed}) == 16
    small_ids = {str(c["allocation_id"]) for c in cmds if c["tenant_id"] == small}
    assert sum(1 for p in placed if p["allocation_id"] in small_ids) == 5    # and so 11 of the big tenant's
    failed = [r["data"] for r in replies if r["type"] == "scheduler.slot_reservation_failed"]
    assert {f["code"] for f in failed} <= {"quota-exceeded", "no-capacity"}
    async with env.rt.pool.acquire() as conn:
        await _assert_no_double_booking_nor_overrun(conn, env.pool)
