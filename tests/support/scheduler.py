"""The scheduler as its tests start it: a leader-elected scheduler in-process, consuming, with a watcher on
its events and a pool of its own (``Env``), so that nothing another test left in the session's shared
inventory can take a request; and the bus conversations a test has with it."""
from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field

from services.node_agent.adapters.discovery.sim import sim_topology
from services.scheduler.bootstrap import build
from shared.wire import step_key
from tests.support.bus import caused_by
from tests.support.bus import send_command as send

REPLIES = ("scheduler.slots_reserved", "scheduler.slot_reservation_failed", "scheduler.reservation_queued")


@dataclass
class Env:
    """One test's world: a started scheduler, a watcher on its events, a pool of its own."""
    rt: object
    js: object
    events: object
    pool: str = field(default_factory=lambda: f"p-{uuid.uuid4().hex[:12]}")

    async def define_pool(self, **kw) -> None:
        await send(self.js, "scheduler.define_pool", {"name": self.pool, **kw})
        await self.events.wait_for(lambda i: i[1]["type"] == "scheduler.pool_changed"
                                   and i[1]["data"]["name"] == self.pool)

    async def node_event(self, node: uuid.UUID, pred=lambda d: True, timeout: float = 20.0) -> dict:
        hits = await self.events.wait_for(lambda i: i[1]["type"] == "scheduler.node_changed"
                                          and i[1]["data"]["node_id"] == str(node) and pred(i[1]["data"]), timeout)
        return hits[-1][1]["data"]

    async def register(self, node: uuid.UUID, *, model: str = "H100", gpus: int = 8, name: str | None = None) -> None:
        await send(self.js, "scheduler.register_node", {"node_id": node, "name": name or f"n-{node.hex[:16]}",
                                                        "gpu_model": model, "gpu_count": gpus, "pool": self.pool})

    async def report(self, node: uuid.UUID, topology: dict) -> None:
        await send(self.js, "scheduler.report_topology", {"node_id": node, "driver": "sim", "topology": topology})

    async def approve(self, node: uuid.UUID, proposal: int, wipe_policy: str | None = None) -> None:
        await send(self.js, "scheduler.approve_slot_map", {"node_id": node, "proposal": proposal,
                                                           "approved_by": uuid.uuid4(), "wipe_policy": wipe_policy})

    async def onboard(self, kind: str = "hgx-h100-8", **kw) -> uuid.UUID:
        """Declare, discover and approve one node; returns its id once it is schedulable."""
        node = uuid.uuid4()
        topo = sim_topology(f"n-{node.hex}", kind)
        await self.register(node, model=topo.gpus[0].model, gpus=len(topo.gpus))
        await self.report(node, topo.to_dict())
        doc = await self.node_event(node, lambda d: d["status"] == "pending_approval")
        await self.approve(node, doc["proposal"], **kw)
        await self.node_event(node, lambda d: d["status"] == "schedulable")
        return node

    async def update(self, node: uuid.UUID, **fields) -> dict:
        env, _ = await send(self.js, "scheduler.update_node", {"node_id": node, "requested_by": uuid.uuid4(), **fields})
        hits = await self.events.wait_for(caused_by(env))
        return hits[-1][1]

    async def grant(self, tenant: uuid.UUID, limit: int, *, model: str = "H100", guaranteed: int = 0,
                    user: uuid.UUID | None = None) -> dict:
        env, _ = await send(self.js, "scheduler.set_quota", {
            "tenant_id": tenant, "gpu_model": model, "pool": self.pool, "limit": limit, "guaranteed": guaranteed,
            "user_id": user, "set_by": uuid.uuid4()})
        hits = await self.events.wait_for(lambda i: i[1].get("causation_id") == str(env.id)
                                          and i[1]["type"] == "scheduler.quota_changed")
        return hits[-1][1]["data"]

    def reserve_cmd(self, tenant: uuid.UUID, shape: str = "vm.2gpu", *, alloc: uuid.UUID | None = None,
                    saga: uuid.UUID | None = None, **kw) -> dict:
        saga, alloc = saga or uuid.uuid4(), alloc or uuid.uuid4()
        gpus = {"vm.1gpu": 1, "vm.2gpu": 2, "vm.4gpu": 4, "vm.8gpu": 8, "bm.8gpu": 8}.get(shape, 1)
        return {"saga_id": saga, "step": "reserve_slots", "idempotency_key": step_key(saga, "reserve_slots"),
                "allocation_id": alloc, "tenant_id": tenant, "shape": shape, "gpu_count": gpus,
                "pool": self.pool, **kw}

    async def reserve(self, tenant: uuid.UUID, shape: str = "vm.2gpu", **kw) -> dict:
        """Send a reserve command and wait for its first reply; returns the reply envelope."""
        cmd = self.reserve_cmd(tenant, shape, **kw)
        await send(self.js, "scheduler.reserve_slots", cmd)
        return await self.reply(cmd["allocation_id"])

    async def reply(self, alloc, types=REPLIES, timeout: float = 20.0) -> dict:
        hits = await self.events.wait_for(lambda i: i[1]["type"] in types
                                          and i[1]["data"].get("allocation_id") == str(alloc), timeout)
        return hits[0][1]

    async def release(self, alloc: uuid.UUID, compensates: str | None = None) -> dict:
        saga = uuid.uuid4()
        env, _ = await send(self.js, "scheduler.release_slots", {
            "saga_id": saga, "step": "release_slots", "idempotency_key": step_key(saga, "release_slots"),
            "allocation_id": alloc, "tenant_id": uuid.uuid4(), "compensates": compensates})
        hits = await self.events.wait_for(lambda i: i[1].get("causation_id") == str(env.id)
                                          and i[1]["type"] == "scheduler.slots_released")
        return hits[0][1]

    async def held(self, alloc: uuid.UUID) -> list[tuple[uuid.UUID, int]]:
        async with self.rt.pool.acquire() as conn:
            rows = await conn.fetch("SELECT node_id, idx FROM slots WHERE allocation_id=$1 ORDER BY idx", alloc)
        return [(r["node_id"], r["idx"]) for r in rows]


async def start(run_service, nc, watch, **overrides) -> Env:
    """A leader-elected scheduler that is consuming, its event watcher, and a fresh pool."""
    from services.scheduler.settings import SchedulerSettings
    sched = overrides.pop("scheduler", SchedulerSettings(preemption_grace_s=0.5, stats_s=0.5, burn_in=False))
    rt = await run_service("scheduler", lambda s: build(s, sched), **overrides)
    await asyncio.wait_for(rt.leadership.leading.wait(), 30)
    env = Env(rt, nc.jetstream(), await watch("scheduler.evt.>"))
    await env.define_pool()
    return env
