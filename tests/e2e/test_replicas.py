"""The stateless services scale by replicas on one durable consumer: with two replicas of each of allocation,
network, storage, billing and saga sharing the load, every allocation still gets every effect exactly once."""
from __future__ import annotations

import asyncio
import json
import re
import signal
import uuid
from collections import Counter

import aiohttp

from tests.support.platform import NOTHING_LEFT, leftovers

STATELESS = ("allocation", "network", "storage", "billing", "saga")
# each an effect one allocation must see exactly once over its life (one envelope id each)
ONCE = ("allocation.requested", "allocation.activated", "allocation.release_requested",
        "allocation.released", "scheduler.slots_reserved", "network.network_attached", "network.network_detached",
        "storage.volume_provisioned", "storage.volume_deleted", "billing.meter_stopped",
        "saga.completed:allocate", "saga.completed:release")
HANDLED = re.compile(r'^tessera_messages_consumed_total\{[^}]*outcome="ok"[^}]*\} (\S+)$', re.M)


async def handled(port: int) -> float:
    """Messages a process's consumers handled (its own /metrics)."""
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/metrics") as r:
        return sum(float(v) for v in HANDLED.findall(await r.text()))


async def test_two_replicas_of_each_stateless_service_under_load_give_every_effect_exactly_once(
        platform, make_tenant, platform_nc, db):
    seen: dict[tuple[str, str], set[str]] = {}

    async def on_message(msg) -> None:
        env = json.loads(msg.data)
        data = env.get("data") or {}
        if data.get("allocation_id"):
            what = f"{env['type']}:{data['kind']}" if env["type"].startswith("saga.") else env["type"]
            seen.setdefault((data["allocation_id"], what), set()).add(env["id"])
    sub = await platform_nc.subscribe("*.evt.>", cb=on_message)
    replicas = await asyncio.gather(*(platform.add_replica(s, "1") for s in STATELESS))
    try:
        before = {name: await handled(platform.procs[name].port) for name in (*STATELESS, *replicas)}
        tenant = await make_tenant()
        created = await asyncio.gather(*(tenant.user.create_allocation(f"replica-{i}", shape="vm.1gpu", volume_gb=10)
                                         for i in range(12)))
        ids = [a["id"] for a in created]
        await asyncio.gather(*(tenant.user.wait_state(i, "ACTIVE", timeout=120) for i in ids))
        await asyncio.gather(*(tenant.user.release(i) for i in ids))
        await asyncio.gather(*(tenant.user.wait_state(i, "RELEASED", timeout=120) for i in ids))
        await platform_nc.flush()

        for i in ids:
            counts = {t: len(seen.get((i, t), ())) for t in ONCE}
            assert counts == dict.fromkeys(ONCE, 1), f"allocation {i}: {counts}"
            assert await leftovers(db, i) == NOTHING_LEFT
        # billing meters each activation (allocation.activated) once, whichever of its replicas took it
        meters = await db.fetch("SELECT allocation_id, count(*) AS n FROM billing.meters "
                                "WHERE allocation_id = ANY($1::uuid[]) GROUP BY allocation_id", [uuid.UUID(i) for i in ids])
        assert {str(r["allocation_id"]): r["n"] for r in meters} == dict.fromkeys(ids, 1)
        # one saga of each kind per allocation, and every step answered at its first attempt
        sagas = Counter(r["kind"] for r in await db.fetch(
            "SELECT kind FROM saga.sagas WHERE allocation_id = ANY($1::uuid[])", [uuid.UUID(i) for i in ids]))
        assert sagas == {"allocate": 12, "release": 12}
        assert await db.fetchval(
            "SELECT max(st.attempt) FROM saga.saga_steps st JOIN saga.sagas s ON s.id = st.saga_id "
            "WHERE s.allocation_id = ANY($1::uuid[])", [uuid.UUID(i) for i in ids]) == 1
        # and both replicas of every service took part
        after = {name: await handled(platform.procs[name].port) for name in before}
        idle = [name for name in before if after[name] <= before[name]]
        assert not idle, f"replicas that handled nothing: {idle}"
    finally:
        await sub.unsubscribe()
        for name in replicas:
            platform.kill(name, signal.SIGTERM)
            del platform.procs[name]
