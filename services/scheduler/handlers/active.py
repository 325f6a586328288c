"""The active scheduler's in-memory index: the domain ``Scheduler`` loaded from PostgreSQL.

PostgreSQL is the source of truth; this index only makes decisions fast. It is loaded when this replica
becomes the leader. A placement is recorded in it when decided (synchronously, so concurrent handlers of
one process see each other's decisions: kube-scheduler's "assume"); a release frees capacity in it only
after the release has committed (``UnitOfWork.on_commit``), since a claim cannot take a slot whose
committed row still names an allocation. Safety never rests on the index: every claim is conditional in
SQL. When a claim finds the index was stale (a slot taken, a quota used up by a transaction it did not
see), the decision is undone in memory (``forget``), the node's committed holdings are re-read
(``resync_node``) and the decision is taken again. A handler that fails after changing the index marks it
for a full reload before the next decision (``ensure_loaded``).
"""
from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import asyncpg
import structlog

from ..adapters.repository import PgSchedulerRepository
from ..domain.claims import NIL
from ..domain.gang import Gang
from ..domain.inventory import Inventory, NodeState, Placement, Pool, Request, SlotTaken
from ..domain.ports import SchedulerRepository
from ..domain.queue import FairQueue, QueueFull
from ..domain.quota import QuotaBook, QuotaKey
from ..domain.scheduler import Scheduler
from ..domain.shapes import Shape
from ..domain.topology import SlotMap
from ..settings import SchedulerSettings

log = structlog.get_logger()

RepositoryFactory = Callable[[asyncpg.Connection], SchedulerRepository]


def node_state(row: dict[str, Any]) -> NodeState:
    """A node row as the domain sees it: schedulable only with an approved map and status schedulable; a
    quarantined slot is not schedulable (as a slot without a wipe policy)."""
    slot_map = SlotMap.from_dict(row["approved_slot_map"]) if row["approved_slot_map"] else SlotMap(())
    out = {q["slot"] for q in row.get("quarantined") or ()}
    if out:
        slot_map = SlotMap(tuple(replace(s, wipe_policy=None) if s.index in out else s for s in slot_map.slots))
    return NodeState(row["id"], row["name"], row["pool"], row["gpu_model"], row["region"], row["site"], row["rack"],
                     row["labels"], row["taints"], row["cordoned"], slot_map, row["status"] == "schedulable")


def shape_of(row: dict[str, Any]) -> Shape:
    return Shape(row["name"], row["kind"], row["gpu_count"], row["gpu_model"], row["mig_profile"])


def request_of(cmd: dict[str, Any], shape: Shape, enqueued_at: float = 0.0) -> Request:
    """The domain request for a ``reserve_slots`` command (as received, or as stored in ``pending``)."""
    return Request(uuid.UUID(str(cmd["allocation_id"])), uuid.UUID(str(cmd["tenant_id"])), shape,
                   priority=cmd.get("priority", 0), spot=cmd.get("spot", False), pool=cmd.get("pool"),
                   tolerations=frozenset(cmd.get("tolerations", ())), enqueued_at=enqueued_at,
                   fail_fast=cmd.get("fail_fast", False))


def gang_of(cmd: dict[str, Any], shape: Shape, enqueued_at: float = 0.0) -> Gang:
    """The domain gang for a ``reserve_gang`` command (as received, or as stored in ``gangs``): its template is
    the request every member makes, under the gang's id."""
    template = request_of({**cmd, "allocation_id": cmd["gang_id"]}, shape, enqueued_at)
    return Gang(template, tuple(uuid.UUID(str(m)) for m in cmd["members"]))


class ActiveScheduler:
    """The index, and how its handlers reach storage: ``repository`` builds the ``SchedulerRepository`` on a unit
    of work's connection (the asyncpg one unless told otherwise: the unit tests pass an in-memory fake)."""

    def __init__(self, settings: SchedulerSettings, *, repository: RepositoryFactory = PgSchedulerRepository):
        self.settings = settings
        self.repository = repository
        self.sched: Scheduler | None = None
        self.shapes: dict[str, Shape] = {}
        self.all_shapes: dict[str, Shape] = {}    # deleted ones too: running allocations keep theirs
        self.needs_reload = False
        self.seen_pending: set[uuid.UUID] = set()    # tenants with a pending gauge to reset when empty
        self.unindexed: set[uuid.UUID] = set()       # allocations SQL holds or queues that the load could not index
        self.pool: asyncpg.Pool | None = None
        self._loaded = asyncio.Event()
        self._reload_lock = asyncio.Lock()

    # ---- loading
    async def load(self, pool: asyncpg.Pool) -> None:
        """(Re)build the index from committed state. May take a while at scale (one pass per table)."""
        started = time.perf_counter()
        self.pool = pool
        async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
            sched = await self._build(self.repository(conn))
        self.sched, self.needs_reload = sched, False
        self._loaded.set()
        log.info("scheduler.index_loaded", nodes=len(sched.inv), holdings=len(sched.inv.holdings()),
                 pending=len(sched.queue), seconds=round(time.perf_counter() - started, 3))

    async def _build(self, store: SchedulerRepository) -> Scheduler:
        self.unindexed = set()
        shape_rows = await store.shapes()
        self.all_shapes = {r["name"]: shape_of(dict(r)) for r in shape_rows}
        self.shapes = {r["name"]: self.all_shapes[r["name"]] for r in shape_rows if not r["deleted"]}
        inv = Inventory()
        for p in await store.pools():
            inv.set_pool(Pool(p["name"], p["policy"], p["taints"]))
        for row in await store.nodes():
            inv.upsert_node(node_state(row))
        quotas = QuotaBook()
        for q in await store.quotas():
            if q["user_id"] == NIL:
                quotas.set_limit(QuotaKey(q["tenant_id"], q["gpu_model"], q["pool"]), q["limit"], q["guaranteed"])
        sched = Scheduler(inv, quotas, FairQueue(self.settings.queue_per_tenant), aging_s=self.settings.aging_s,
                          clock=time.time)
        for a in await store.holdings():
            self._adopt(sched, a)
        await self._load_queue(store, sched)
        return sched

    def _adopt(self, sched: Scheduler, a: dict[str, Any]) -> None:
        shape = self.all_shapes.get(a["shape"]) or Shape(a["shape"], "vm", max(a["gpus"], 1))
        req = Request(a["allocation_id"], a["tenant_id"], shape, priority=a["priority"], spot=a["spot"],
                      enqueued_at=a["placed_at"].timestamp())
        try:
            sched.adopt(req, Placement(a["node_id"], a["pool"], a["gpu_model"], tuple(a["slots"]), a["mig_profile"]))
        except (SlotTaken, KeyError) as exc:   # a slot retired by a newer map: the row still counts in SQL
            self.unindexed.add(a["allocation_id"])
            log.warning("scheduler.holding_not_indexed", allocation_id=str(a["allocation_id"]), error=repr(exc))

    async def _load_queue(self, store: SchedulerRepository, sched: Scheduler) -> None:
        for p in await store.all_pending():
            shape = self.shapes.get(p["request"]["shape"])
            if shape is None:
                self.unindexed.add(p["allocation_id"])
                continue
            req = request_of(p["request"], shape, p["enqueued_at"].timestamp())
            try:
                sched.queue.push(req)
            except QueueFull as exc:   # the bound was lowered meanwhile: it still waits in SQL
                self.unindexed.add(req.allocation_id)
                log.warning("scheduler.pending_not_indexed", allocation_id=str(req.allocation_id), error=repr(exc))
                continue
            if p["nominated_node"] is not None and sched.inv.node(p["nominated_node"]) is not None:
                sched.restore_nomination(req.allocation_id, p["nominated_node"])
        for g in await store.waiting_gangs():
            shape = self.shapes.get(g["request"]["shape"])
            if shape is None:
                continue
            try:
                sched.restore_gang(gang_of(g["request"], shape, g["enqueued_at"].timestamp()))
            except QueueFull as exc:   # the bound was lowered meanwhile: it still waits in SQL
                log.warning("scheduler.gang_not_indexed", gang_id=str(g["gang_id"]), error=repr(exc))
        for victim, preemptor in await store.preemption_pairs():
            sched.restore_preemption(victim, preemptor)

    async def ensure_loaded(self) -> Scheduler:
        """The index, waiting for the first load, and reloading first when a failure marked it stale."""
        await self._loaded.wait()
        if self.needs_reload:
            async with self._reload_lock:
                if self.needs_reload:
                    await self.load(self.pool)
        return self.sched

    def unload(self) -> None:
        """Leadership lost: stop deciding until the next load."""
        self._loaded.clear()
        self.sched = None

    # ---- applying committed (or about to commit) changes
    def apply_node(self, row: dict[str, Any]) -> None:
        if self.sched is not None:
            self.sched.inv.upsert_node(node_state(row))

    def apply_shape(self, shape: Shape, *, deleted: bool) -> None:
        self.all_shapes[shape.name] = shape
        if deleted:
            self.shapes.pop(shape.name, None)
        else:
            self.shapes[shape.name] = shape

    def apply_pool(self, row: dict[str, Any]) -> None:
        if self.sched is not None:
            self.sched.inv.set_pool(Pool(row["name"], row["policy"], row["taints"]))

    def apply_quota(self, row: dict[str, Any]) -> None:
        if self.sched is not None and row["user_id"] == NIL:
            self.sched.quotas.set_limit(QuotaKey(row["tenant_id"], row["gpu_model"], row["pool"]), row["limit"],
                                        row["guaranteed"])

    def may_stand_in_sql(self, allocation_id: uuid.UUID) -> bool:
        """False only when the database surely neither holds nor queues the allocation, so a reserve need not
        read it: with leader election this replica alone decides, one transaction at a time, and the index
        follows each (a failed handler marks it for a reload before the next decision), so every holding and
        queued request is in it, bar those the load could not index (``unindexed``). Without leader
        election another replica may have placed it: always True."""
        sched = self.sched
        return (not self.settings.leader_election or allocation_id in self.unindexed
                or sched.inv.holding(allocation_id) is not None or allocation_id in sched.queue)

    def forget(self, allocation_id: uuid.UUID) -> None:
        """Undo a placement the database refused (the domain's release would also re-run the queue)."""
        self.sched.unplace(allocation_id)

    async def resync_node(self, store: SchedulerRepository, node_id: uuid.UUID) -> None:
        """Add to the index the holdings on one node that the database has and the index missed (what made
        a claim fail). Holdings only the index has are kept: they may be decisions of this process whose
        transactions have not committed yet; a failed one marks the index for a full reload instead."""
        sched = self.sched
        node = sched.inv.node(node_id)
        known = set(node.allocs) if node is not None else set()
        for r in await store.holdings(node_id, list(known)):
            self._adopt(sched, r)
        row = await store.node(node_id)
        if row is not None:
            self.apply_node(row)

    async def resync_quota(self, store: SchedulerRepository, key: QuotaKey) -> None:
        """Make the index's use of one quota what the database holds."""
        used = await store.quota_used(key.tenant_id, key.gpu_model, key.pool)
        if used is not None:
            book = self.sched.quotas
            book.refund(key, book.used(key))
            book.charge(key, used)

    def position(self, tenant_id: uuid.UUID) -> int:
        """A new request's place in its tenant's FIFO (the fair order across tenants changes with use)."""
        return max(self.sched.queue.pending().get(tenant_id, 1), 1)
