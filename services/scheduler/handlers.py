"""Scheduler's handlers: register nodes, reserve slots (first fit, saga step), release them (undo).

Reservation, and why it can never give a slot twice: placement runs on an
unlocked snapshot, then the chosen node's row is locked (``FOR UPDATE``) and its
free slots are read again; only if the allocation still fits there are the
slots claimed, with ``allocation_id IS NULL`` in the UPDATE and the affected
row count checked. Node locks are taken in ascending name order (a node that
no longer fits is passed over for nodes after it), so two reservations can
never deadlock on each other.
"""
from __future__ import annotations

import asyncpg

from shared.consumer import HandlerContext, PermanentError
from shared.participant import StepRejected, invoke, undo

from . import contracts as c
from .adapters import repository
from .domain.model import NodeConflict, NodeSpec, Placement, check_reregistration, first_fit, shortfall


class SlotConflict(Exception):
    """A claimed slot was not free although the node was locked: roll back, the consumer retries."""


async def register_node(ctx: HandlerContext, cmd: c.RegisterNode) -> None:
    """Create the node and its slots, emit node_registered. Idempotent on node_id (same spec: no-op);
    raises PermanentError for another spec under that id or a name another node has."""
    spec = NodeSpec(cmd.node_id, cmd.name, cmd.gpu_model, cmd.gpu_count, dict(cmd.labels))
    if await repository.add_node(ctx.conn, spec):
        await ctx.emit("scheduler.node_registered", c.NodeRegistered(
            node_id=spec.id, name=spec.name, gpu_model=spec.gpu_model, gpu_count=spec.gpu_count))
        return
    existing = await repository.get_node(ctx.conn, cmd.node_id)
    if existing is None:
        holder = await repository.get_node_by_name(ctx.conn, cmd.name)
        raise PermanentError(f"node name {cmd.name!r} is taken by node {holder.id if holder else '(unknown)'}")
    try:
        check_reregistration(existing, spec)
    except NodeConflict as exc:
        raise PermanentError(str(exc)) from None


def _reply(p: Placement) -> dict:
    return {"node_id": p.node_id, "slots": list(p.slots), "gpu_model": p.gpu_model}


async def _reserve(conn: asyncpg.Connection, cmd: c.ReserveSlots) -> dict:
    held = await repository.held_by(conn, cmd.allocation_id)
    if held is not None:  # reserved before under another key: the same answer, no second reservation
        return _reply(held)
    passed_over: str | None = None
    while True:
        view = await repository.capacity(conn)
        choice = first_fit(view, cmd.gpu_count, after=passed_over)
        if choice is None:
            raise StepRejected(shortfall(view, cmd.gpu_count, cmd.shape))
        node = await repository.lock_node(conn, choice.node_id)
        confirmed = first_fit([node], cmd.gpu_count) if node else None
        if confirmed is None:  # another reservation took that node's slots while we waited for its lock
            passed_over = node.name if node else passed_over
            continue
        claimed = await repository.claim(conn, confirmed, cmd.allocation_id)
        if claimed != len(confirmed.slots):
            raise SlotConflict(f"claimed {claimed} of slots {confirmed.slots} on locked node {confirmed.node_id}")
        return _reply(confirmed)


async def _release(conn: asyncpg.Connection, cmd: c.ReleaseSlots) -> dict:
    return {"slots_freed": await repository.release(conn, cmd.allocation_id)}


async def reserve_slots(ctx: HandlerContext, cmd: c.ReserveSlots, *, sim_faults: bool = False) -> None:
    """Saga step: reserve ``gpu_count`` slots on one node (first fit), once per key; 'no capacity' → failure."""
    await invoke(ctx, cmd, _reserve, succeeded="scheduler.slots_reserved", failed="scheduler.slot_reservation_failed",
                 reply_model=c.SlotsReserved, failure_model=c.SlotReservationFailed, sim_faults=sim_faults)


async def release_slots(ctx: HandlerContext, cmd: c.ReleaseSlots) -> None:
    """Saga step or compensation: free every slot of the allocation (idempotent; safe if none were held)."""
    await undo(ctx, cmd, _release, undone="scheduler.slots_released", reply_model=c.SlotsReleased)
