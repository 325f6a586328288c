"""The scheduler's port: what its handlers and its index need from storage, stated without any (pure, no I/O).

``adapters.repository.PgSchedulerRepository`` implements it on a unit of work's connection; the unit tests use an
in-memory fake. Nothing here commits: every change belongs to the caller's unit of work. Rows are dicts with the
schema's column names (JSON columns decoded), as the ``*_changed`` documents are built from them.

Safety never rests on the caller's index: ``claim`` takes slots and charges quota conditionally, all or nothing,
whatever the caller believed (see adapters/claims.py for the locks and their order).
"""
from __future__ import annotations

import abc
import uuid
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Any

from .claims import Claim, QuotaExceeded, ShapeDeleted, SlotTaken

Row = dict[str, Any]


class SchedulerRepository(abc.ABC):
    """Nodes and their slots, shapes, pools, quotas, holdings (allocations), the queue and preemptions."""

    @abc.abstractmethod
    def savepoint(self) -> AbstractAsyncContextManager[None]:
        """A block whose writes are all undone when it raises (the unit of work goes on)."""

    # --- nodes ---------------------------------------------------------------------------------------------------
    @abc.abstractmethod
    async def node(self, node_id: uuid.UUID, *, lock: bool = False) -> Row | None:
        """The node's row with its ``quarantined`` slots, or None. ``lock`` serialises every writer of this node
        id until the unit of work ends, even before the node exists."""

    @abc.abstractmethod
    async def nodes(self) -> list[Row]:
        """Every node's row (for loading the index), by name."""

    @abc.abstractmethod
    async def node_name_holder(self, name: str) -> uuid.UUID | None:
        """The id of the node with that name, or None."""

    @abc.abstractmethod
    async def insert_node(self, node_id: uuid.UUID, fields: Row) -> bool:
        """Create the node; False (nothing written) if the id or the name exists already."""

    @abc.abstractmethod
    async def update_node(self, node_id: uuid.UUID, fields: Row) -> None:
        """Change the given columns and bump the node's version (ValueError naming a column it has not)."""

    @abc.abstractmethod
    async def node_document(self, node_id: uuid.UUID) -> Row:
        """The node as the ``scheduler.node_changed`` payload (free slots and capacity counted with it)."""

    @abc.abstractmethod
    async def install_slots(self, node_id: uuid.UUID, slots: list[Row]) -> None:
        """Make an approved map's slots the node's (held ones keep their allocation; those the map lacks are
        retired); raises the node's capacity sequence."""

    @abc.abstractmethod
    async def quarantine_slots(self, node_id: uuid.UUID, reasons: dict[int, str]) -> list[int]:
        """Take the slots out of service with their reasons; returns those newly quarantined."""

    @abc.abstractmethod
    async def return_slot(self, node_id: uuid.UUID, slot: int) -> bool:
        """A quarantined slot back in service; False if it was not quarantined."""

    @abc.abstractmethod
    async def renew_quarantine(self, node_id: uuid.UUID, slot: int, reason: str) -> bool:
        """A quarantined slot's new reason; False if it was not quarantined."""

    # --- shapes, pools, quotas -----------------------------------------------------------------------------------
    @abc.abstractmethod
    async def shapes(self) -> list[Row]:
        """Every shape, deleted ones included."""

    @abc.abstractmethod
    async def upsert_shape(self, shape: Row) -> Row:
        """Create or change a shape; returns its row after the change (version bumped)."""

    @abc.abstractmethod
    async def pools(self) -> list[Row]:
        """Every pool."""

    @abc.abstractmethod
    async def pool_exists(self, name: str) -> bool:
        """Whether the pool is defined."""

    @abc.abstractmethod
    async def upsert_pool(self, pool: Row) -> Row:
        """Create or change a pool; returns its row after the change (version bumped)."""

    @abc.abstractmethod
    async def quotas(self) -> list[Row]:
        """Every quota row, users' shares included."""

    @abc.abstractmethod
    async def set_quota(self, tenant_id: uuid.UUID, gpu_model: str, pool: str, user_id: uuid.UUID | None,
                        limit: int, guaranteed: int) -> Row:
        """Set a quota's limit and guarantee; a new one starts with what the tenant (or user) holds as used."""

    @abc.abstractmethod
    async def quota_used(self, tenant_id: uuid.UUID, gpu_model: str, pool: str) -> int | None:
        """What the tenant's own quota counts as used (None: it has none)."""

    # --- holdings ------------------------------------------------------------------------------------------------
    @abc.abstractmethod
    async def claim(self, claim: Claim, *, count: bool = True) -> tuple[list[Row], Row | None]:
        """Charge quota, take the slots and record the holding, all or nothing: (slot details, the node's capacity
        after it, None unless ``count``). Raises QuotaExceeded, SlotTaken or ShapeDeleted, leaving nothing."""

    async def claim_all(self, claims: list[Claim]) -> dict[uuid.UUID, Row]:
        """Every claim or none (a gang's members), then their nodes' capacity counted once: node id ->
        {"free_slots", "seq"}. Raises the first refused claim's QuotaExceeded, SlotTaken or ShapeDeleted with
        ``.claim`` naming it, leaving nothing. This one claims in turn in a savepoint; a repository may do it in
        one round trip."""
        async with self.savepoint():
            for c in claims:
                try:
                    await self.claim(c, count=False)
                except (QuotaExceeded, SlotTaken, ShapeDeleted) as exc:
                    exc.claim = c
                    raise
            return await self.capacity_changed([c.node_id for c in claims])

    async def claim_each(self, claims: list[Claim]) -> list[tuple[list[Row], Row] | Exception]:
        """Each claim on its own, counting its node, in order: per claim (slot details, the node's capacity
        after it) or the QuotaExceeded, SlotTaken or ShapeDeleted that refused it (leaving nothing of it). This
        one claims in turn; a repository may do it in one round trip."""
        out: list[tuple[list[Row], Row] | Exception] = []
        for c in claims:
            try:
                details, capacity = await self.claim(c)
                out.append((details, capacity))
            except (QuotaExceeded, SlotTaken, ShapeDeleted) as exc:
                out.append(exc)
        return out

    @abc.abstractmethod
    async def capacity_changed(self, node_ids: list[uuid.UUID]) -> dict[uuid.UUID, Row]:
        """Raise each node's capacity sequence and count its free slots: node id -> {"free_slots", "seq"}."""

    @abc.abstractmethod
    async def capacity(self, node_id: uuid.UUID) -> Row:
        """The node's {"free_slots", "seq"} without raising the sequence."""

    @abc.abstractmethod
    async def held(self, allocation_id: uuid.UUID) -> Row | None:
        """The allocation's holding, or None."""

    @abc.abstractmethod
    async def holdings(self, node_id: uuid.UUID | None = None, known: list[uuid.UUID] = ()) -> list[Row]:
        """Every holding; with ``node_id``, that node's less the ``known`` ones."""

    @abc.abstractmethod
    async def holdings_on(self, node_id: uuid.UUID) -> int:
        """How many allocations hold slots on the node."""

    @abc.abstractmethod
    async def slot_details(self, node_id: uuid.UUID, slots: list[int]) -> list[Row]:
        """The slots' details, in slot order."""

    @abc.abstractmethod
    async def release(self, allocation_id: uuid.UUID) -> tuple[Row | None, Row | None]:
        """Free the holding and refund its quota: (its row or None when it held nothing, the node's capacity
        after it or None). Idempotent."""

    async def withdraw(self, allocation_id: uuid.UUID) -> tuple[Row | None, Row | None, Row | None]:
        """What a release command changes: ``release``, then ``dequeue``: (the holding's row or None, the node's
        capacity after it or None, the queue entry or None). Idempotent. A repository may do it in one round
        trip."""
        row, capacity = await self.release(allocation_id)
        return row, capacity, await self.dequeue(allocation_id)

    async def withdraw_each(self, allocation_ids: list[uuid.UUID]) -> list[tuple[Row | None, Row | None, Row | None]]:
        """``withdraw`` for each allocation, in order (one named twice is found empty the second time). This one
        withdraws in turn; a repository may do it in one round trip."""
        return [await self.withdraw(a) for a in allocation_ids]

    @abc.abstractmethod
    async def shape_users(self, name: str) -> tuple[int, int]:
        """Before deleting the shape: (allocations using it, placed or queued; other live shapes). Waits for the
        claims of the shape in flight and holds new ones off until the unit of work ends."""

    @abc.abstractmethod
    async def hold_shape(self, name: str) -> bool:
        """Take the shape's guard for a request that waits in the queue; False when the shape is deleted."""

    # --- the queue and preemptions -------------------------------------------------------------------------------
    @abc.abstractmethod
    async def enqueue(self, request: Row, correlation_id: str) -> datetime:
        """Queue a ``reserve_slots`` command (as JSON); returns its enqueue time (the first one when repeated)."""

    @abc.abstractmethod
    async def pending(self, allocation_id: uuid.UUID, *, lock: bool = False) -> Row | None:
        """The allocation's queue entry (request, correlation_id, idempotency_key, enqueued_at...), or None."""

    @abc.abstractmethod
    async def all_pending(self) -> list[Row]:
        """Every queue entry, oldest first."""

    @abc.abstractmethod
    async def dequeue(self, allocation_id: uuid.UUID) -> Row | None:
        """Take the allocation out of the queue; returns its entry, or None when it was not queued."""

    @abc.abstractmethod
    async def standing(self, allocation_id: uuid.UUID) -> tuple[bool, Row | None]:
        """(whether it waits in the queue, its holding as JSON or None)."""

    @abc.abstractmethod
    async def nominate(self, allocation_id: uuid.UUID, node_id: uuid.UUID | None) -> None:
        """Record the node a queued request is nominated to."""

    @abc.abstractmethod
    async def record_preemption(self, victim: Row, preemptor: uuid.UUID, reason: str, grace_s: float) -> Row | None:
        """Record that ``victim`` (a holding) will be preempted, with its grace deadline; None if it already is."""

    @abc.abstractmethod
    async def preemption_pairs(self) -> list[tuple[uuid.UUID, uuid.UUID]]:
        """(victim, preemptor) of every preemption whose victim still holds its slots."""

    # --- gangs (N allocations all or nothing) --------------------------------------------------------------------
    @abc.abstractmethod
    async def gang(self, gang_id: uuid.UUID, *, lock: bool = False) -> Row | None:
        """The gang's row (request, correlation_id, state queued/placed/rejected, outcome, enqueued_at), or None."""

    @abc.abstractmethod
    async def record_gang(self, request: Row, correlation_id: str, state: str, outcome: Row | None) -> Row:
        """Record a new gang's decision (a ``reserve_gang`` command as JSON); an existing row is returned as it is."""

    @abc.abstractmethod
    async def decide_gang(self, gang_id: uuid.UUID, state: str, outcome: Row) -> bool:
        """A waiting gang placed or withdrawn, with its answer; False when it was not waiting."""

    @abc.abstractmethod
    async def waiting_gangs(self) -> list[Row]:
        """Every waiting gang, oldest first."""
