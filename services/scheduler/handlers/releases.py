"""The reserve step's undo (reservations.py ``release_slots``): free an allocation's slots, at once or with its
batch's others.

A release frees what the allocation holds, refunds its quota and takes its request out of the queue should it
wait there, in one round trip (the repository's ``withdraw``); slots whose wipe failed are quarantined first (the
held row names the node), and a request released while waiting is answered failed ``cancelled``. It is answered
through the kit (``shared.participant.undo``: the tombstone of the key it compensates, then ``slots_released``
with the node and its free slots after it). Idempotent: a repeat finds nothing held and frees nothing. The index
frees the slots only once the release commits: freed earlier, a concurrent claim would pick them while the
committed row still names the allocation, and fail.

In the consumer kit's first run of a batch of several (``Writes.batched``), a release locks the key it
compensates and makes its quarantine, then leaves the rest (``BatchReleases.leave``): just before the batch
writes, every allocation left is withdrawn in one round trip (``withdraw_each``: each the ordinary ``withdraw``,
in order), then each release is answered through ``undo`` as it would have answered itself. A second release of
an allocation left in the batch first has those left withdrawn, so that it finds what a release made at once
would have left. Should anything fail, the kit runs the batch again with each release alone, withdrawing at once.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from functools import partial

import structlog

from shared import participant
from shared.unit_of_work import UnitOfWork

from .. import contracts as c
from ..domain.ports import Row, SchedulerRepository
from .active import ActiveScheduler
from .common import LeftForBatch, emit_node
from .placing import conclude, place_released

log = structlog.get_logger()

Withdrawn = tuple[Row | None, Row | None, Row | None]    # the holding, the node's capacity, the queue entry


async def release(ctx: UnitOfWork, cmd: c.ReleaseSlots, active: ActiveScheduler) -> None:
    """Free the allocation's slots (see the module docstring): at once, or left for the batch's round trip."""
    batch = BatchReleases.of(ctx, active)
    if batch is not None:                 # withdrawn with the batch's others, and answered then
        await batch.leave(ctx, cmd)
        return
    await participant.undo(ctx, cmd, participant.over(active.repository, partial(_release, ctx=ctx, active=active)),
                           step=c.RESERVE_SLOTS)


async def _release(store: SchedulerRepository, cmd: c.ReleaseSlots, *, ctx: UnitOfWork,
                   active: ActiveScheduler) -> dict:
    quarantined_on = await _quarantine(ctx, store, cmd)
    withdrawn = await store.withdraw(cmd.allocation_id)    # quota use: published by a loop
    return await _released(ctx, active, store, cmd, quarantined_on, withdrawn)


async def _quarantine(ctx: UnitOfWork, store: SchedulerRepository, cmd: c.ReleaseSlots) -> uuid.UUID | None:
    """Quarantine the slots whose wipe failed, before the release frees the rest (the held row names the node);
    the operator event per slot goes out now, the node's document with the release. Returns the node."""
    held = await store.held(cmd.allocation_id) if cmd.quarantine else None
    if held is None:
        return None
    node_id = held["node_id"]
    await store.node(node_id, lock=True)
    reasons = {q.slot: q.reason for q in cmd.quarantine if q.slot in held["slots"]}
    for slot in await store.quarantine_slots(node_id, reasons):
        await ctx.emit("scheduler.slot_state_changed", c.SlotStateChanged(
            node_id=node_id, slot=slot, state="quarantined", reason=reasons[slot], allocation_id=cmd.allocation_id))
        log.warning("scheduler.slot_quarantined", node_id=str(node_id), slot=slot, reason=reasons[slot])
    return node_id


async def _released(ctx: UnitOfWork, active: ActiveScheduler, store: SchedulerRepository, cmd: c.ReleaseSlots,
                    quarantined_on: uuid.UUID | None, withdrawn: Withdrawn) -> dict:
    """What follows the withdraw: the quarantined node's document, the waiting request's answer, the index's
    share once committed. Returns the ``slots_released`` fields."""
    row, capacity, queued = withdrawn
    if quarantined_on is not None:
        node_row = await store.node(quarantined_on)
        await emit_node(ctx, store, quarantined_on)
        # the index learns of the quarantine before it frees the allocation's slots
        ctx.on_commit(partial(_apply_node, active, node_row))
    if queued is not None and queued["idempotency_key"] != cmd.compensates:
        await conclude(ctx, queued["request"], "failed", {"reason": "released while waiting", "code": "cancelled"},
                       queued["correlation_id"])
    ctx.on_commit(partial(place_released, ctx, active, cmd.allocation_id))
    if row is None:
        return {"slots_freed": 0}
    return {"slots_freed": len(row["slots"]), "node_id": row["node_id"], "capacity": capacity}


async def _apply_node(active: ActiveScheduler, row: dict) -> None:
    active.apply_node(row)


@dataclass(frozen=True)
class _Left:
    ctx: UnitOfWork
    cmd: c.ReleaseSlots
    quarantined_on: uuid.UUID | None


class BatchReleases(LeftForBatch):
    """The releases of one batch (``_Left``), withdrawn together before it writes, then answered; ``of`` is None
    when a release must withdraw at once."""

    name = "scheduler.releases"
    left: dict[uuid.UUID, _Left]

    async def leave(self, ctx: UnitOfWork, cmd: c.ReleaseSlots) -> None:
        """Lock the compensated key (``undo`` would, before any effect), quarantine, and leave the withdraw."""
        if cmd.allocation_id in self.left:        # released earlier in the batch: that one withdraws first
            await self.flush()
        if cmd.compensates and cmd.compensates not in ctx.writes.known:
            await participant.recorded(ctx, cmd.compensates)
        quarantined_on = await _quarantine(ctx, self.active.repository(ctx.conn), cmd)
        self.left[cmd.allocation_id] = _Left(ctx, cmd, quarantined_on)

    async def flush(self) -> None:
        """Withdraw every allocation left, in one round trip, then answer each release as ``undo`` does."""
        left, self.left = list(self.left.values()), {}
        if not left:
            return
        store = self.active.repository(self.ctx.conn)
        withdrawn = await store.withdraw_each([lf.cmd.allocation_id for lf in left])   # quota use: published by a loop
        for lf, w in zip(left, withdrawn, strict=True):
            answer = partial(_answer, lf=lf, active=self.active, store=store, withdrawn=w)
            await participant.undo(lf.ctx, lf.cmd, answer, step=c.RESERVE_SLOTS)


async def _answer(_conn, cmd: c.ReleaseSlots, *, lf: _Left, active: ActiveScheduler, store: SchedulerRepository,
                  withdrawn: Withdrawn) -> dict:
    """``undo``'s action for a release left in the batch: its withdraw is made already."""
    return await _released(lf.ctx, active, store, cmd, lf.quarantined_on, withdrawn)
