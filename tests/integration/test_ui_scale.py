"""The dashboard's pages at fleet scale: 10,000 nodes and 100,000 allocations (with 300,000 events) seeded straight
into the gateway's read models, each page rendered through HTTP and timed. The figures are printed (docs/dashboard.md
lists them); the bound is generous, there to catch a page whose query lost its index."""
from __future__ import annotations

import statistics
import time
import uuid

import aiohttp

from tests.support.gateway import ADMIN_KEY

NODES, ALLOCATIONS, TENANTS = 10_000, 100_000, 50
BOUND_S = 2.0

SEED = """
INSERT INTO tenants (id, name) SELECT md5('tenant' || g)::uuid, 'scale-tenant-' || g FROM generate_series(1, {tenants} - 1) g;
INSERT INTO nodes_view (id, name, gpu_model, gpu_count, status, pool, version, changed_at)
  SELECT md5('node' || g)::uuid, 'node-' || lpad(g::text, 5, '0'), 'H100', 8, 'schedulable', 'shared', 1, now()
  FROM generate_series(0, {nodes} - 1) g;
INSERT INTO node_capacity_view (node_id, free_slots, seq)
  SELECT md5('node' || g)::uuid, 2, 1 FROM generate_series(0, {nodes} - 1) g;
INSERT INTO node_health_view (node_id, pool, state, since, version)
  SELECT md5('node' || g)::uuid, 'shared', CASE WHEN g % 500 = 0 THEN 'suspect' ELSE 'healthy' END, now(), 1
  FROM generate_series(0, {nodes} - 1) g;
INSERT INTO allocations_view (id, tenant_id, user_id, name, shape, gpu_count, volume_gb, state, node_id, created_at,
                              updated_at)
  SELECT md5('alloc' || g)::uuid,
         CASE WHEN g % {tenants} = 0 THEN $1::uuid ELSE md5('tenant' || (g % {tenants}))::uuid END,
         md5('user' || (g % {tenants}))::uuid, 'job-' || g, 'vm.2gpu', 2, 0,
         CASE WHEN g < 30000 THEN 'ACTIVE' WHEN g < 31000 THEN 'PROVISIONING' WHEN g < 32000 THEN 'RELEASING'
              WHEN g < 34000 THEN 'QUEUED' WHEN g < 90000 THEN 'RELEASED' ELSE 'FAILED' END,
         CASE WHEN g < 32000 THEN md5('node' || (g % {nodes}))::uuid END,
         now() - make_interval(secs => g * 25), now() - make_interval(secs => g * 25)
  FROM generate_series(0, {allocations} - 1) g;
INSERT INTO allocation_events (event_id, allocation_id, type, envelope, recorded_at)
  SELECT gen_random_uuid(), md5('alloc' || g)::uuid, t.type, jsonb_build_object('type', t.type, 'data', jsonb_build_object()),
         now() - make_interval(secs => g * 25) + make_interval(secs => t.lag)
  FROM generate_series(0, {allocations} - 1) g,
       (VALUES ('allocation.requested', 0), ('scheduler.slots_reserved', 2), ('allocation.activated', 9)) t(type, lag)
  ORDER BY g DESC, t.lag;
ANALYZE tenants; ANALYZE nodes_view; ANALYZE node_capacity_view; ANALYZE node_health_view;
ANALYZE allocations_view; ANALYZE allocation_events;
"""


async def seed(api, tenant_id: str) -> None:
    """The fleet, its allocations and their events; every 50th allocation is the test tenant's."""
    sql = SEED.format(nodes=NODES, allocations=ALLOCATIONS, tenants=TENANTS)
    async with api.rt.pool.acquire() as conn:
        for statement in (s.strip() for s in sql.split(";\n") if s.strip()):
            await conn.execute(statement, *([uuid.UUID(tenant_id)] if "$1" in statement else []))


async def signed_in(api, key: str) -> aiohttp.ClientSession:
    base = str(api.http._base_url)
    s = aiohttp.ClientSession(base_url=base, cookie_jar=aiohttp.CookieJar(unsafe=True))
    async with s.post("/ui/login", data={"api_key": key}, headers={"Origin": base.rstrip("/")}, allow_redirects=False) as r:
        assert r.status == 303
    return s


async def timed(s: aiohttp.ClientSession, path: str, rounds: int = 3) -> float:
    took = []
    for _ in range(rounds):
        started = time.perf_counter()
        async with s.get(path) as r:
            body = await r.read()
            assert r.status == 200, (path, r.status, body[:300])
        took.append(time.perf_counter() - started)
    return statistics.median(took)


async def test_every_page_renders_quickly_over_ten_thousand_nodes_and_a_hundred_thousand_allocations(api):
    tenant_id = await api.new_tenant()
    _, user = await api.new_user(tenant_id, "tenant_admin")
    started = time.perf_counter()
    await seed(api, tenant_id)
    print(f"\nseeded {NODES} nodes, {ALLOCATIONS} allocations, {3 * ALLOCATIONS} events in "
          f"{time.perf_counter() - started:.1f} s")
    figures = {}
    async with await signed_in(api, ADMIN_KEY) as op:
        async with op.get("/ui/allocations") as r:
            cursor = (await r.text()).split("/ui/allocations?cursor=")[1].split('"')[0]
        for path in ("/ui/", "/ui/?after=node-05000", "/ui/fragments/fleet?after=node-09900",
                     "/ui/fragments/counters", "/ui/fragments/events", "/ui/allocations",
                     f"/ui/allocations?cursor={cursor}", "/ui/data/latency.json",
                     "/ui/nodes/" + await api.scalar("SELECT md5('node42')::uuid::text"),
                     "/ui/allocations/" + await api.scalar("SELECT md5('alloc7')::uuid::text")):
            figures[f"operator {path[:48]}"] = await timed(op, path)
    async with await signed_in(api, user["api_key"]) as tenant:
        for path in ("/ui/", "/ui/allocations", "/ui/fragments/events", "/ui/resources", "/ui/billing", "/ui/audit"):
            figures[f"tenant {path}"] = await timed(tenant, path)
    for name, seconds in figures.items():
        print(f"{name:<60} {seconds * 1000:8.1f} ms")
    slow = {n: s for n, s in figures.items() if s > BOUND_S}
    assert not slow, slow
