"""`./taskw bench:failover` — not a test. How fast Tessera moves tenants off a failed node without a human.

One durable platform (PostgreSQL with fsync, JetStream with ``sync_interval: always``), a pool ``failover`` of
``--nodes`` sim nodes (8 H100 each) placed with the ``spread`` policy, three tenants whose ``vm.1gpu`` and
``vm.2gpu`` allocations (``--allocations-per-node`` per node, alternating shapes and tenants) fill it. Then
``--rounds`` rounds, alternating the two failures a provider meets:
  xid   a fatal XID (79) injected into GPU 0 of the node holding the most allocations (the sim's health probe
        reports it in the next heartbeat; the scheduler cordons the node and interrupts what runs there);
  kill  that node's agent killed (SIGKILL; its sim guests die with it): only silence tells, so the scheduler
        cordons after twice the heartbeat timeout.
Each round is timed from the bus (JetStream watchers on scheduler.evt.> and allocation.evt.>, envelopes'
``occurred_at``) against the fault's instant: fault → ``scheduler.node_changed`` with ``cordoned``; cordon →
the last ``allocation.rescheduled`` of the node's allocations; fault → each allocation ACTIVE again elsewhere.
After a round the node comes back as a provider would bring it: the fault cleared and the node uncordoned (xid),
or the agent restarted (kill: the scheduler fences what it kept and lifts its own cordon); its quarantined slots
are re-wiped. Not timed.
Baseline of the same run: ``--baseline`` fresh allocations, created in batches of one node's worth (as many at
once as a failure re-places), each timed from its POST to its ``allocation.activated``; the ratio of a
re-placement (interrupted → rescheduled) to a fresh create, at the median.
The heartbeat period and timeout are the platform's defaults (what a provider gets) and printed; the pool's
breaker is relaxed (share 1, window 1 s) so repeated faults in one pool are not held back, and that is printed
too. The last line is one JSON object."""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import nats

from services.allocation.domain.policy import RESCHEDULE_LIMITS
from services.node_agent.settings import NodeAgentSettings
from services.scheduler.settings import SchedulerSettings
from shared.settings import load
from tests.bench.common import log_problems, pct, report, work_dir
from tests.support.bus import StreamWatcher, publish_from_node
from tests.support.polling import eventually
from tooling.client import TesseraClient
from tooling.platform import Platform

POOL = "failover"
SHAPES = ("vm.1gpu", "vm.2gpu")
MOVES_ALLOWED = min(RESCHEDULE_LIMITS["node_lost"], RESCHEDULE_LIMITS["gpu_fault"])   # then it fails instead
TARGETS = {   # figure: (direction, value); Kubernetes takes about 350 s before anything moves
    "cordon_p99_s_xid": ("<=", 10), "cordon_p99_s_kill": ("<=", 10),
    "all_replaced_max_s": ("<=", 30), "fault_to_active_p95_s": ("<=", 60),
}
ENV = {
    "TESSERA_LOG_LEVEL": "WARNING",
    # one pool takes every fault of the run: the breaker would stop automatic cordons after half its nodes
    "TESSERA_SCHEDULER_BREAKER_SHARE": "1", "TESSERA_SCHEDULER_BREAKER_WINDOW_S": "1",
}


def at(envelope: dict) -> datetime:
    """When it happened: an allocation event's own ``at``, else when the envelope was made."""
    return datetime.fromisoformat(envelope["data"].get("at") or envelope["occurred_at"])


def of_type(type_: str, since: datetime, **data):
    """Predicate for a watcher's items: an envelope of ``type_`` occurred at or after ``since`` whose data
    has these values."""
    return lambda i: (i[1]["type"] == type_ and at(i[1]) >= since
                      and all(str(i[1]["data"].get(k)) == str(v) for k, v in data.items()))


class Bench:
    """The run's tenants, where each of their allocations is and how often it moved, and the bus watchers
    every figure is read from."""

    def __init__(self, platform: Platform, nc, sched: StreamWatcher, allocs: StreamWatcher,
                 admin: TesseraClient, tenants: list[TesseraClient]):
        self.platform, self.nc, self.sched, self.allocs = platform, nc, sched, allocs
        self.admin, self.tenants = admin, tenants
        self.where: dict[str, str] = {}   # allocation id → node id, as the events say
        self.owner: dict[str, TesseraClient] = {}
        self.moves: dict[str, int] = {}   # allocation id → how often it was rescheduled

    async def create(self, n: int, offset: int = 0) -> list[tuple[str, float]]:
        """``n`` allocations at once (shapes and tenants alternating); each (id, seconds POST → activated)."""
        async def one(i: int) -> tuple[str, float]:
            t0 = datetime.now(UTC)
            tenant = self.tenants[i % len(self.tenants)]
            a = await tenant.create_allocation(f"fo-{uuid.uuid4().hex[:6]}", SHAPES[i % len(SHAPES)], pool=POOL)
            self.owner[a["id"]] = tenant
            [hit, *_] = await self.allocs.wait_for(of_type("allocation.activated", t0, allocation_id=a["id"]), 120)
            self.where[a["id"]] = hit[1]["data"]["node_id"]
            return a["id"], (at(hit[1]) - t0).total_seconds()
        return await asyncio.gather(*(one(offset + i) for i in range(n)))

    async def release(self, ids: list[str]) -> None:
        for aid in ids:
            await self.owner[aid].release(aid)
        await asyncio.gather(*(self.owner[a].wait_state(a, "RELEASED", 120) for a in ids))
        for aid in ids:
            self.where.pop(aid, None)

    async def retire_worn(self) -> int:
        """Replace by fresh ones the allocations moved as often as a node failure allows (the allocation service
        fails the next move instead): a tenant would have recreated them. Returns how many."""
        worn = [a for a in self.where if self.moves.get(a, 0) >= MOVES_ALLOWED]
        if worn:
            await self.release(worn)
            await self.create(len(worn), offset=random.randrange(len(SHAPES)))
        return len(worn)

    def victim(self, last: str | None) -> str:
        """The node to fail next: not the last one, holding allocations moved least often (the spread policy
        sends a failed node's allocations to the emptiest nodes: the last victim, once back), then the most."""
        held: dict[str, list[str]] = {}
        for aid, node in self.where.items():
            held.setdefault(node, []).append(aid)
        return min(sorted(held), key=lambda n: (n == last, max(self.moves.get(a, 0) for a in held[n]),
                                                -len(held[n])))

    async def fault(self, kind: str, node: str, **extra) -> None:
        await publish_from_node(self.nc, "node_agent.inject_fault", node, {
            "node_id": node, "kind": kind, "request_id": str(uuid.uuid4()), **extra})

    async def round(self, kind: str, node: str) -> dict:
        """Fail ``node`` (``kind``: xid or kill), time the failover, bring the node back."""
        moving = sorted(a for a, n in self.where.items() if n == node)
        t0 = datetime.now(UTC)
        if kind == "xid":
            await self.fault("xid", node, gpu=0, code=79)
        else:
            await asyncio.to_thread(self.platform.kill, f"node_agent:{node}")
        [cordon, *_] = await self.sched.wait_for(of_type("scheduler.node_changed", t0, node_id=node, cordoned=True), 60)
        rescheduled = await self.moved(moving, node, t0)
        interrupted = {i[1]["data"]["allocation_id"]: at(i[1])
                       for i in self.allocs.items if of_type("allocation.interrupted", t0, node_id=node)(i)}
        health = [i[1]["data"]["event"] for i in self.sched.items
                  if of_type("scheduler.node_health_changed", t0, node_id=node)(i) and "cordoned" in i[1]["data"]["event"]]
        done = {i[1]["data"]["allocation_id"]: i[1] for i in rescheduled}
        for aid, env in done.items():
            self.where[aid] = env["data"]["to_node_id"]
            self.moves[aid] = self.moves.get(aid, 0) + 1
        last = max(at(e) for e in done.values())
        t_back = time.perf_counter()
        await self.recover(kind, node)
        return {
            "kind": kind, "node": node, "allocations": len(moving),
            "cordon_s": round((at(cordon[1]) - t0).total_seconds(), 2),
            "all_replaced_after_cordon_s": round((last - at(cordon[1])).total_seconds(), 2),
            "fault_to_active_s": sorted(round((at(e) - t0).total_seconds(), 2) for e in done.values()),
            "replacement_s": sorted(round((at(e) - interrupted[a]).total_seconds(), 2)
                                    for a, e in done.items() if a in interrupted),
            "gap_s": sorted(round(e["data"]["gap_s"], 2) for e in done.values()),
            "health_event": health[0] if health else None,
            "recovery_s": round(time.perf_counter() - t_back, 1),
        }

    async def moved(self, moving: list[str], node: str, t0: datetime, timeout: float = 180) -> list:
        """The ``allocation.rescheduled`` envelopes of ``moving`` off ``node`` since ``t0``, once there is one for
        each; RuntimeError with the events when one of them failed instead, or after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            hits = [i for i in self.allocs.items if of_type("allocation.rescheduled", t0, from_node_id=node)(i)]
            failed = [i[1]["data"] for i in self.allocs.items if of_type("allocation.failed", t0)(i)
                      and i[1]["data"]["allocation_id"] in moving]
            if len(hits) >= len(moving) or failed or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        if failed or len(hits) < len(moving):
            seen = [(i[1]["type"], i[1]["data"].get("allocation_id"), i[1]["data"].get("reason"))
                    for i in self.allocs.items if at(i[1]) >= t0]
            raise RuntimeError(f"{len(hits)} of {len(moving)} allocation(s) rescheduled off {node}; "
                               f"failed: {failed}; events since the fault: {seen}")
        return hits

    async def recover(self, kind: str, node: str) -> None:
        """The node schedulable again with all its slots: fault cleared and uncordoned by the provider (xid), or
        the agent back and the scheduler's own cordon lifted (kill); its quarantined slots re-wiped."""
        if kind == "xid":
            await self.fault("clear", node)
            await self.admin.request("POST", f"/v1/nodes/{node}/uncordon")
        else:
            await self.platform.restart(f"node_agent:{node}")
        await eventually(lambda: self.admin.node(node), timeout=90, until=lambda n: not n["cordoned"],
                         what=f"node {node} uncordoned")
        quarantined = await eventually(lambda: self.admin.node(node), timeout=30,
                                       until=lambda n: n.get("quarantined"), what=f"quarantined slots of {node}")
        for q in quarantined["quarantined"]:
            await self.admin.rewipe(node, q["slot"])
        await eventually(lambda: self.admin.node(node), timeout=90, until=lambda n: not n.get("quarantined"),
                         what=f"node {node}'s slots re-wiped")


def spread(values: list[float], *qs: float) -> dict[str, float | None]:
    return {f"p{round(q * 100)}": (round(pct(values, q), 2) if values else None) for q in qs}


async def main(nodes: int, rounds: int, per_node: int, baseline: int, seed: int) -> dict:
    random.seed(seed)
    work = work_dir("tessera-bench-failover-")
    print(f"work dir (service logs: logs/): {work}", file=sys.stderr)
    platform = Platform(work, env=ENV, durable=True)
    phases: dict[str, float] = {}
    clock = time.perf_counter()

    def phase(name: str) -> None:
        nonlocal clock
        phases[name] = round(time.perf_counter() - clock, 1)
        clock = time.perf_counter()
    await platform.start()
    phase("platform_start")
    nc = sched = allocs = None
    try:
        nc = await nats.connect(platform.nats_url, **platform.connect_options("admin"))
        sched = await StreamWatcher().start(nc.jetstream(), "scheduler.evt.>")
        allocs = await StreamWatcher().start(nc.jetstream(), "allocation.evt.>")
        async with platform.admin() as admin:
            await admin.define_pool(POOL, "spread")
            for i in range(nodes):
                await platform.add_node(f"fo-{i:02d}", "H100", 8, pool=POOL)
            keys = []
            for t_no in range(3):
                t = await admin.create_tenant(f"bench-failover-{t_no}")
                await admin.set_quota(t["id"], POOL, "H100", 8 * nodes)
                keys.append((await admin.create_user(t["id"], "bench", "tenant_user"))["api_key"])
            tenants = [await TesseraClient(platform.gateway_url, k).__aenter__() for k in keys]
            bench = Bench(platform, nc, sched, allocs, admin, tenants)
            try:
                phase("nodes")
                fill = await bench.create(nodes * per_node)
                phase("fill")
                fresh: list[float] = []
                for b in range(0, baseline, per_node):
                    batch = await bench.create(min(per_node, baseline - b), offset=random.randrange(len(SHAPES)))
                    fresh += [s for _, s in batch]
                    await bench.release([a for a, _ in batch])
                phase("baseline")
                results, last, retired = [], None, 0
                for r in range(rounds):
                    kind = ("xid", "kill")[r % 2]
                    retired += await bench.retire_worn()
                    last = bench.victim(last)
                    results.append(await bench.round(kind, last))
                    print(f"round {r + 1}/{rounds}: {json.dumps(results[-1])}", file=sys.stderr)
                phase("rounds")
            finally:
                for t in tenants:
                    await t.__aexit__(None, None, None)
    finally:
        for w in (sched, allocs):
            if w:
                await w.stop()
        if nc:
            await nc.close()
        await platform.stop()
    out = summary(results, fresh, fill, nodes, per_node, seed, phases, work)
    out["allocations_retired"] = retired   # moved to the limit and recreated between rounds (untimed)
    return out


def summary(results: list[dict], fresh: list[float], fill: list, nodes: int, per_node: int, seed: int,
            phases: dict[str, float], work: Path) -> dict:
    def kind(k: str, field: str) -> list[float]:
        return [r[field] for r in results if r["kind"] == k]
    to_active = [s for r in results for s in r["fault_to_active_s"]]
    replacement = [s for r in results for s in r["replacement_s"]]
    replaced = [r["all_replaced_after_cordon_s"] for r in results]
    sched, agent = SchedulerSettings.from_env(ENV), load(NodeAgentSettings, ENV)
    out = {
        "nodes": nodes, "allocations_per_node": per_node, "allocations": len(fill), "rounds": len(results),
        "seed": seed, "allocations_moved": len(to_active),
        "heartbeat_s": agent.heartbeat_s, "heartbeat_timeout_s": sched.heartbeat_timeout_s,
        "health_period_s": sched.health_period_s,
        "breaker": {"share": sched.breaker_share, "window_s": sched.breaker_window_s,
                    "note": "relaxed for the run: every round faults the same pool"},
        "cordon_s_xid": spread(kind("xid", "cordon_s"), 0.5, 0.99),
        "cordon_s_kill": spread(kind("kill", "cordon_s"), 0.5, 0.99),
        "all_replaced_after_cordon_s": {**spread(replaced, 0.5), "max": max(replaced, default=None)},
        "all_replaced_after_cordon_s_xid": max(kind("xid", "all_replaced_after_cordon_s"), default=None),
        "all_replaced_after_cordon_s_kill": max(kind("kill", "all_replaced_after_cordon_s"), default=None),
        "fault_to_active_s": spread(to_active, 0.5, 0.95, 0.99),
        "fault_to_active_s_xid": spread([s for r in results if r["kind"] == "xid" for s in r["fault_to_active_s"]],
                                        0.5, 0.95, 0.99),
        "fault_to_active_s_kill": spread([s for r in results if r["kind"] == "kill" for s in r["fault_to_active_s"]],
                                         0.5, 0.95, 0.99),
        "replacement_s": spread(replacement, 0.5, 0.99),
        "fresh_create_s": spread(fresh, 0.5, 0.99), "fresh_allocations": len(fresh),
        "replacement_to_fresh_ratio_p50": (round(pct(replacement, 0.5) / pct(fresh, 0.5), 2)
                                           if replacement and fresh else None),
        "rounds_detail": results,
        "service_log_lines": log_problems(list((work / "logs").glob("*.log"))),
        "phase_wall_s": phases,
    }
    figures = {"cordon_p99_s_xid": out["cordon_s_xid"]["p99"], "cordon_p99_s_kill": out["cordon_s_kill"]["p99"],
               "all_replaced_max_s": out["all_replaced_after_cordon_s"]["max"],
               "fault_to_active_p95_s": out["fault_to_active_s"]["p95"]}
    out["targets"] = {k: f"{op} {v}" for k, (op, v) in TARGETS.items()}
    out["reference_kubernetes_before_anything_moves_s"] = 350   # node-monitor grace + pod eviction timeout
    out["met"] = {k: figures[k] is not None and (figures[k] >= v if op == ">=" else figures[k] <= v)
                  for k, (op, v) in TARGETS.items()}
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=6, help="sim nodes of 8 H100 in the pool")
    ap.add_argument("--rounds", type=int, default=6, help="failures, alternating a fatal XID and a killed agent")
    ap.add_argument("--allocations-per-node", type=int, default=3, help="tenant allocations per node at the start")
    ap.add_argument("--baseline", type=int, default=12, help="fresh allocations timed create → ACTIVE")
    ap.add_argument("--seed", type=int, default=1, help="seeds the baseline's choice of shapes")
    args = ap.parse_args()
    if args.nodes < 2:
        ap.error("--nodes: at least 2 (a failed node's allocations need another)")
    t0 = time.perf_counter()
    result = asyncio.run(main(args.nodes, args.rounds, args.allocations_per_node, args.baseline, args.seed))
    result["bench_wall_s"] = round(time.perf_counter() - t0, 1)
    report(result, skip=("rounds_detail",))
