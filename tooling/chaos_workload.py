"""The chaos run's platform, its tenants' workload, its history, and its end: everything released, a settle
period, the invariants checked (``tooling.chaos_checks``).

A tenant loops: it creates an allocation (vm.1gpu … vm.4gpu, now and then a spot one or a high-priority one that
may preempt it; the tenants together ask for more than the nodes hold, so some requests queue), watches it until
it is ACTIVE (the create → ACTIVE latency), and releases an ACTIVE one now and then. A call that meets a dead or
paused gateway, or a 5xx of a service behind it, is sent again (a creation with the same idempotency key).
"""
from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from pathlib import Path

import aiohttp
import asyncpg
import nats

from shared.streams import DEAD_LETTER_STREAM

from . import chaos_checks as checks
from .client import ApiError, TesseraClient
from .embedded_cluster import EmbeddedNatsCluster
from .platform import Platform
from .supervision import RestartPolicy

TRANSIENT = (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError)
TERMINAL = ("RELEASED", "FAILED")
SHAPES = ("vm.1gpu", "vm.1gpu", "vm.2gpu", "vm.2gpu", "vm.4gpu")
OPEN_PER_TENANT = 4
QUOTA_GPUS = 16   # per tenant: three tenants may ask for twice what three nodes of 8 GPUs hold


async def start_platform(workdir: Path, nodes: int, env: dict[str, str]) -> tuple[Platform, list[str]]:
    from tests.support.platform import E2E_ENV
    p = Platform(workdir, env={**E2E_ENV, **env}, durable=False, supervise=True, nats_servers=3,
                 restart_policy=RestartPolicy(initial_s=0.5, cap_s=5, stable_s=10, poll_s=0.1))
    await p.start()
    try:
        node_ids = [await p.add_node(f"chaos-{i}", "H100", 8, env={"TESSERA_SIM_LATENCY_S": "0.2"})
                    for i in range(nodes)]
    except BaseException:
        await p.stop()
        raise
    return p, node_ids


async def retried(call, timeout: float = 60.0):
    """``call()``'s answer, sent again while no answer comes (a refused connection, a timeout, a 5xx); an answer
    that refuses (a 4xx) raises its ApiError; TimeoutError when nothing answered within ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await asyncio.wait_for(call(), 15)
        except TRANSIENT:
            pass
        except ApiError as exc:
            if exc.status < 500:
                raise
        if time.monotonic() > deadline:
            raise TimeoutError("no answer")
        await asyncio.sleep(0.3)


async def nodes_holding(database_url: str) -> list[str]:
    """The nodes with an ACTIVE allocation now, in a stable order."""
    db = await asyncpg.connect(database_url)
    try:
        rows = await db.fetch("SELECT DISTINCT node_id FROM allocation.allocations WHERE state = 'ACTIVE' "
                              "ORDER BY node_id")
    finally:
        await db.close()
    return [str(r["node_id"]) for r in rows]


class History:
    """The run's JSONL history (one object a line, ``t`` seconds since the run began) and the harness's own
    admin connection to the bus (to every server of a cluster)."""

    def __init__(self, path: Path, nc):
        self.file, self.nc = open(path, "a"), nc
        self.t0, self.wall0 = time.monotonic(), time.time()

    @classmethod
    async def open(cls, path: Path, p: Platform) -> History:
        servers = p.nats.urls if isinstance(p.nats, EmbeddedNatsCluster) else [p.nats_url]
        nc = await nats.connect(servers, max_reconnect_attempts=-1, reconnect_time_wait=0.5,
                                **p.connect_options("admin"))
        return cls(path, nc)

    def restart_clock(self, t0: float) -> None:
        self.t0, self.wall0 = t0, time.time() - (time.monotonic() - t0)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def write(self, record: str, **fields) -> None:
        """One line: ``{"t", "record": request|answer|fault|event|dead_letter|run|settle, ...fields}``."""
        self.file.write(json.dumps({"t": round(self.now(), 3), "record": record, **fields}, default=str) + "\n")
        self.file.flush()

    async def read_stream(self, stream: str, subject: str) -> list[dict]:
        """Every message of ``stream`` on ``subject`` (in stream order): its subject, headers, body and ``t``."""
        js = self.nc.jetstream()
        sub = await js.subscribe(subject, stream=stream, ordered_consumer=True)
        found = []
        try:
            while True:
                try:
                    msg = await sub.next_msg(timeout=5)
                except nats.errors.TimeoutError:
                    break
                found.append({"subject": msg.subject, "headers": dict(msg.headers or {}), "body": msg.data,
                              "t": round(msg.metadata.timestamp.timestamp() - self.wall0, 3)})
                if msg.metadata.num_pending == 0:
                    break
        finally:
            await sub.unsubscribe()
        return found

    async def close(self) -> None:
        try:
            await self.nc.close()
        finally:
            self.file.close()


class Tenant:
    def __init__(self, name: str, client: TesseraClient, rng: random.Random):
        self.name, self.client, self.rng = name, client, rng
        self.allocations: dict[str, dict] = {}   # id -> {"state", "sent"}

    def open(self) -> list[str]:
        return [a for a, v in self.allocations.items() if v["state"] not in TERMINAL]


class Workload:
    def __init__(self, history: History, tenants: list[Tenant]):
        self.history, self.tenants = history, tenants
        self.latencies: list[float] = []
        self.completed = self.unanswered = 0
        self._stop = asyncio.Event()
        self._watching: set[asyncio.Task] = set()

    @classmethod
    async def start(cls, p: Platform, history: History, count: int, rng: random.Random) -> Workload:
        tenants = []
        async with p.admin() as admin:
            for i in range(count):
                t = await admin.create_tenant(f"chaos-{i}-{uuid.uuid4().hex[:6]}")
                await admin.set_quota(t["id"], "shared", "H100", QUOTA_GPUS)
                key = (await admin.create_user(t["id"], "u", "tenant_user"))["api_key"]
                client = await TesseraClient(p.gateway_url, key).__aenter__()
                tenants.append(Tenant(t["name"], client, random.Random(rng.random())))
        return cls(history, tenants)

    def owner(self, allocation_id: str) -> Tenant | None:
        return next((t for t in self.tenants if allocation_id in t.allocations), None)

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        await asyncio.gather(*(self._loop(t) for t in self.tenants))

    async def _loop(self, t: Tenant) -> None:
        while not self._stop.is_set():
            try:
                await asyncio.wait_for(self._stop.wait(), t.rng.uniform(0.5, 2.0))
                return
            except TimeoutError:
                pass
            active = [a for a in t.open() if t.allocations[a]["state"] == "ACTIVE"]
            if active and (len(t.open()) >= OPEN_PER_TENANT or t.rng.random() < 0.35):
                await self.release(t, t.rng.choice(sorted(active)))
            elif len(t.open()) < OPEN_PER_TENANT:
                await self.create(t)

    async def _call(self, t: Tenant, op: str, call, **fields):
        """Send a request (recorded with its answer); the answer, or None when refused or never answered."""
        rid = str(uuid.uuid4())
        self.history.write("request", id=rid, op=op, tenant=t.name, **fields)
        try:
            answer = await retried(call)
        except ApiError as exc:
            self.completed += 1
            self.history.write("answer", id=rid, status=exc.status, problem=str(exc.problem)[:300])
            return None
        except TimeoutError:
            self.unanswered += 1
            self.history.write("answer", id=rid, status=None)
            return None
        self.completed += 1
        self.history.write("answer", id=rid, status=202, allocation_id=answer.get("id"), state=answer.get("state"))
        return answer

    async def create(self, t: Tenant) -> None:
        shape, r = t.rng.choice(SHAPES), t.rng.random()
        opts = {"priority_class": "high"} if r < 0.1 else {"spot": True, "priority_class": "low"} if r < 0.3 else {}
        key, sent = str(uuid.uuid4()), time.monotonic()
        a = await self._call(t, "create", lambda: t.client.create_allocation(
            f"c-{key[:8]}", shape=shape, idempotency_key=key, **opts), key=key, shape=shape, **opts)
        if a:
            t.allocations[a["id"]] = {"state": a["state"], "sent": sent}
            task = asyncio.create_task(self._watch(t, a["id"]))
            self._watching.add(task)
            task.add_done_callback(self._watching.discard)

    async def release(self, t: Tenant, allocation_id: str) -> None:
        if await self._call(t, "release", lambda: t.client.release(allocation_id), allocation_id=allocation_id):
            t.allocations[allocation_id]["state"] = "RELEASING"

    async def _watch(self, t: Tenant, allocation_id: str) -> None:
        """Follow the allocation's state until it ends (or the workload stops); its first ACTIVE is a latency."""
        seen = t.allocations[allocation_id]
        while not self._stop.is_set() and seen["state"] not in TERMINAL:
            try:
                a = await asyncio.wait_for(t.client.allocation(allocation_id), 10)
            except (*TRANSIENT, ApiError):
                await asyncio.sleep(0.5)
                continue
            if a["state"] == "ACTIVE" and "active_s" not in seen:
                seen["active_s"] = time.monotonic() - seen["sent"]
                self.latencies.append(seen["active_s"])
            if seen["state"] != "RELEASING" or a["state"] in TERMINAL:
                seen["state"] = a["state"]
            await asyncio.sleep(0.5 if "active_s" not in seen else 2.0)

    async def stop_watching(self) -> None:
        for task in list(self._watching):
            task.cancel()
        await asyncio.gather(*self._watching, return_exceptions=True)

    async def close(self) -> None:
        await self.stop_watching()
        for t in self.tenants:
            await t.client.__aexit__(None, None, None)


async def release_everything(db: asyncpg.Connection, workload: Workload, history: History,
                             deadline: float) -> list[dict]:
    """Release every allocation not yet RELEASED or FAILED (again every few seconds while it is not) until none
    is left or ``deadline``; returns those still not ended. Each attempt and its answer is in the history."""
    asked: dict[str, float] = {}
    while True:
        rows = await db.fetch("SELECT id, state FROM allocation.allocations WHERE state <> ALL($1::text[])",
                              list(TERMINAL))
        if not rows or time.monotonic() > deadline:
            return [{"allocation_id": str(r["id"]), "state": r["state"]} for r in rows]
        for r in rows:
            aid, t = str(r["id"]), workload.owner(str(r["id"]))
            if t is None or time.monotonic() - asked.get(aid, 0.0) < 5.0:
                continue
            asked[aid] = time.monotonic()
            try:
                await asyncio.wait_for(t.client.release(aid), 10)
                answer = {"status": 202}
            except TRANSIENT as exc:
                answer = {"status": None, "error": repr(exc)[:200]}
            except ApiError as exc:   # releasing already, or not releasable yet (interrupted): asked again later
                answer = {"status": exc.status, "problem": str(exc.problem)[:300]}
            history.write("settle_release", allocation_id=aid, state=r["state"], **answer)
        await asyncio.sleep(1.0)


def p99(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[max(0, -(-99 * len(ordered) // 100) - 1)], 3)


async def finish(p: Platform, history: History, workload: Workload, injected: list[dict], settle_s: float) -> dict:
    """Release everything, let the platform settle (until every check passes or ``settle_s`` ends; one still
    ACTIVE then lost its release), then check the database, the allocation events and the dead letters;
    returns the run's summary."""
    await workload.stop_watching()
    deadline = time.monotonic() + settle_s
    db = await asyncpg.connect(p.database_url)
    try:
        not_ended = await release_everything(db, workload, history, deadline)
        await workload.close()
        history.write("settle", not_ended=not_ended)
        while True:
            violations = await checks.database_violations(db)
            if not violations or time.monotonic() > deadline:
                break
            await asyncio.sleep(2.0)
        # every allocation was asked to end (again every few seconds): one still ACTIVE lost its release
        violations += [{"check": "release_not_honoured", **a} for a in not_ended if a["state"] == "ACTIVE"]
    finally:
        await db.close()
    events = []
    for m in await history.read_stream("TESSERA_ALLOCATION", "allocation.evt.>"):
        body = json.loads(m["body"])
        events.append({"t": m["t"], "type": body.get("type", m["subject"]), "data": body.get("data")})
        history.write("event", **events[-1])
    violations += checks.history_violations(events)
    dead_letters = []
    for m in await history.read_stream(DEAD_LETTER_STREAM, "deadletter.>"):
        h = m["headers"]
        dead_letters.append({"t": m["t"], "subject": h.get("Tessera-DLQ-Subject", m["subject"]),
                             "reason": h.get("Tessera-DLQ-Reason"), "error": h.get("Tessera-DLQ-Error", "")[:200]})
    windows = [{**f, "at_s": f["started_s"], "duration_s": f["ended_s"] - f["started_s"]} for f in injected]
    violations += checks.dead_letter_violations(dead_letters, windows)
    for dl in dead_letters:
        history.write("dead_letter", **dl)
    return {"faults_injected": sum(f["outcome"] == "injected" for f in injected),
            "faults": [f"{f['started_s']}s {f['kind']} {f.get('target')} {f['outcome']}"
                       for f in sorted(injected, key=lambda f: f["started_s"])],
            "requests_completed": workload.completed, "requests_unanswered": workload.unanswered,
            "allocations": sum(len(t.allocations) for t in workload.tenants),
            "p99_create_to_active_s": p99(workload.latencies), "dead_letters": dead_letters,
            "violations": violations}
