"""The chaos run: the whole platform (a three-server JetStream cluster, every service its own supervised process,
a few sim nodes) under a tenants' workload while faults from a seeded schedule strike it, then the invariants of
``tooling.chaos_checks`` once it has settled.

    python -m tooling.chaos --minutes N --seed S [--nodes K] [--workdir DIR]

The same seed gives the same fault schedule (``schedule``); what the workload meets in between depends on timing.
Everything the run saw is in ``<workdir>/history.jsonl``: the tenants' requests and answers, the faults as injected,
and at the end every allocation event and dead letter read back from their streams. The last line printed is one
JSON object (seed, faults injected, requests completed, p99 of create → ACTIVE, violations); the exit status is 1
when there is any violation.

The scheduler's breaker (how large a share of a pool it may cordon in a window) is opened wide
(TESSERA_SCHEDULER_BREAKER_SHARE=1): otherwise it would hold back the harness's own XIDs after the first few.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from .chaos_workload import History, Workload
from .embedded_cluster import EmbeddedNatsCluster

SERVICES = ("gateway", "allocation", "saga", "scheduler", "network", "storage", "billing")
CHAOS_ENV_EXTRA = {
    "TESSERA_SCHEDULER_BREAKER_SHARE": "1",   # the harness's XIDs are not an epidemic to hold back
    "TESSERA_ACK_WAIT_S": "2",                # a killed consumer's message comes again soon
    "TESSERA_SAGA_STEP_TIMEOUT_S": "30",      # a step outlives a restart or a pause of the service it waits on
    "TESSERA_SAGA_STEP_TIMEOUTS": "provision_node=30",
}
HEARTBEAT_LOSS_S = 15.0
XID_RECOVERY_S = 20.0   # after an XID: clear the node's faults and uncordon it, so its capacity returns


@dataclass(frozen=True)
class Fault:
    """One fault of the schedule: at ``at_s`` seconds into the run, ``kind`` strikes ``target`` (a service name,
    a node or NATS server index) for ``duration_s`` (0: an instant, e.g. a SIGKILL the supervisor answers)."""

    at_s: float
    kind: str   # kill, pause, node_agent_kill, heartbeat_loss, xid, nats_kill, pg_restart
    target: str | int | None
    duration_s: float = 0.0


def schedule(seed: int, run_s: float, nodes: int, nats_servers: int = 3, spacing_s: float = 5.0,
             postgres: bool = True) -> list[Fault]:
    """The faults of a run of ``run_s`` seconds, from ``seed`` alone (pure: the same arguments, the same list).

    Rounds of faults one after another, about ``spacing_s`` apart: in each round every service in turn is
    SIGKILLed or paused (SIGSTOP, SIGCONT a few seconds later), and somewhere among them a node-agent is
    killed, a node loses its heartbeats, a node gets an XID 79, a JetStream server is killed and restarted (with
    a cluster) and PostgreSQL restarts (with ``postgres``)."""
    rng = random.Random(seed)

    def one_round() -> list[tuple[str, str | int | None, float]]:
        steps: list[tuple[str, str | int | None, float]] = []
        for service in SERVICES:
            if rng.random() < 0.6:
                steps.append(("kill", service, 0.0))
            else:
                steps.append(("pause", service, round(rng.uniform(2.0, 5.0), 1)))
        others = [("node_agent_kill", rng.randrange(nodes), 0.0),
                  ("heartbeat_loss", rng.randrange(nodes), HEARTBEAT_LOSS_S),
                  ("xid", rng.randrange(nodes), XID_RECOVERY_S)]
        if nats_servers > 1:
            others.append(("nats_kill", rng.randrange(nats_servers), round(rng.uniform(3.0, 8.0), 1)))
        if postgres:
            others.append(("pg_restart", None, 0.0))
        for other in others:
            steps.insert(rng.randrange(len(steps) + 1), other)
        return steps

    faults, at, steps = [], 3.0, []
    while at < run_s - 3.0:
        if not steps:
            steps = one_round()
        kind, target, duration = steps.pop(0)
        faults.append(Fault(round(at, 1), kind, target, duration))
        at += spacing_s * rng.uniform(0.7, 1.3)
    return faults


class Injector:
    """Injects faults into a running platform and records each (its real start and end) in the history."""

    def __init__(self, platform, history: History, node_ids: list[str]):
        self.p, self.history, self.node_ids = platform, history, node_ids
        self.injected: list[dict] = []

    async def run(self, faults: list[Fault], t0: float) -> None:
        tasks = []
        for f in faults:
            await asyncio.sleep(max(0.0, t0 + f.at_s - time.monotonic()))
            tasks.append(asyncio.create_task(self.inject(f)))
        await asyncio.gather(*tasks)

    async def inject(self, f: Fault) -> None:
        start = self.history.now()
        try:
            detail = await getattr(self, f"_{f.kind}")(f)
            outcome = "injected"
        except Exception as exc:   # a fault that could not be injected is recorded, not fatal to the run
            detail, outcome = {"error": repr(exc)[:300]}, "failed"
        record = {**asdict(f), "started_s": round(start, 2), "ended_s": round(self.history.now(), 2),
                  "outcome": outcome, **(detail or {})}
        self.injected.append(record)
        self.history.write("fault", **record)

    def _pid(self, name: str) -> int:
        proc = self.p.procs[name].proc
        if proc is None or proc.poll() is not None:
            raise ProcessLookupError(f"{name} is not running (a restart is pending)")
        return proc.pid

    async def _kill(self, f: Fault) -> dict:
        pid = self._pid(str(f.target))
        os.kill(pid, signal.SIGKILL)   # from outside, as `kill -9`: the supervisor starts it again
        return {"pid": pid}

    async def _pause(self, f: Fault) -> dict:
        pid = self._pid(str(f.target))
        os.kill(pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(f.duration_s)
        finally:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        return {"pid": pid}

    async def _node_agent_kill(self, f: Fault) -> dict:
        node = self.node_ids[int(f.target) % len(self.node_ids)]
        pid = self._pid(f"node_agent:{node}")
        os.kill(pid, signal.SIGKILL)
        return {"node_id": node, "pid": pid}

    async def _heartbeat_loss(self, f: Fault) -> dict:
        node = self.node_ids[int(f.target) % len(self.node_ids)]
        await self._inject_on_node(node, kind="heartbeat_loss", duration_s=f.duration_s)
        await asyncio.sleep(f.duration_s)
        return {"node_id": node}

    async def _xid(self, f: Fault) -> dict:
        """An XID 79 on a node holding allocations (the schedule's index among them), then after a while its faults
        cleared and the node uncordoned."""
        from .chaos_workload import nodes_holding
        holding = await nodes_holding(self.p.database_url)
        pool = holding or self.node_ids
        node = pool[int(f.target) % len(pool)]
        await self._inject_on_node(node, kind="xid", gpu=0, code=79)
        await asyncio.sleep(f.duration_s)
        await self._recover(node)
        return {"node_id": node, "held_allocations": bool(holding)}

    async def _recover(self, node: str) -> None:
        await self._inject_on_node(node, kind="clear")
        from .chaos_workload import retried
        async with self.p.admin() as admin:
            await retried(lambda: admin.request("POST", f"/v1/nodes/{node}/uncordon", expect=(202,)),
                          timeout=60)

    async def recover_all(self) -> None:
        """Every node's faults cleared and every node uncordoned (before the settle period)."""
        await asyncio.gather(*(self._recover(n) for n in self.node_ids))

    async def _inject_on_node(self, node: str, **fault) -> None:
        from tests.support.bus import publish_from_node
        await publish_from_node(self.history.nc, "node_agent.inject_fault", node,
                                {"node_id": node, "request_id": str(uuid.uuid4()), **fault})

    async def _nats_kill(self, f: Fault) -> dict:
        cluster: EmbeddedNatsCluster = self.p.nats
        i = int(f.target) % len(cluster.members)
        cluster.kill(i)
        await asyncio.sleep(f.duration_s)
        await asyncio.to_thread(cluster.restart, i)
        return {"server": i}

    async def _pg_restart(self, f: Fault) -> dict:
        def restart():
            self.p.pg.stop()
            self.p.pg.start()
        await asyncio.to_thread(restart)
        return {}


async def run(workdir: Path, *, seed: int, run_s: float, nodes: int = 3, tenants: int = 3,
              settle_s: float = 90.0, out=print) -> dict:
    """One chaos run in ``workdir``; returns the summary (its ``violations`` empty when every invariant held)."""
    from .chaos_workload import finish, start_platform
    faults = schedule(seed, run_s, nodes)
    out(f"chaos: seed {seed}, {len(faults)} faults over {run_s:.0f}s, {nodes} nodes, {tenants} tenants; "
        f"TESSERA_SCHEDULER_BREAKER_SHARE=1 (the breaker does not hold back the harness's XIDs)")
    p, node_ids = await start_platform(workdir, nodes, CHAOS_ENV_EXTRA)
    history = await History.open(workdir / "history.jsonl", p)
    load = None
    try:
        workload = await Workload.start(p, history, tenants, random.Random(seed))
        injector = Injector(p, history, node_ids)
        history.write("run", seed=seed, run_s=run_s, nodes=node_ids, faults=[asdict(f) for f in faults])
        t0 = time.monotonic()
        history.restart_clock(t0)
        load = asyncio.create_task(workload.run())
        await injector.run(faults, t0)
        await asyncio.sleep(max(0.0, t0 + run_s - time.monotonic()))
        workload.stop()
        await load
        out(f"chaos: workload stopped at {history.now():.0f}s; recovering nodes, releasing, settling")
        await injector.recover_all()
        summary = await finish(p, history, workload, injector.injected, settle_s)
    finally:
        if load is not None and not load.done():   # the run failed: the workload ends with it
            load.cancel()
            await asyncio.gather(load, return_exceptions=True)
        await history.close()
        await p.stop()
    summary.update(seed=seed, run_s=run_s, nodes=nodes, workdir=str(workdir))
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tooling.chaos", description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=3.0, help="how long faults strike (default 3)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--nodes", type=int, default=3, help="sim nodes of 8 GPUs (default 3)")
    ap.add_argument("--workdir", type=Path, default=None, help="default: a new folder under the temp folder")
    args = ap.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tessera-chaos-"))
    summary = asyncio.run(run(workdir, seed=args.seed, run_s=args.minutes * 60, nodes=args.nodes,
                              out=lambda line: print(line, file=sys.stderr)))
    for v in summary["violations"]:
        print("violation: " + json.dumps(v), file=sys.stderr)
    print(json.dumps(summary, sort_keys=True))
    return 1 if summary["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
