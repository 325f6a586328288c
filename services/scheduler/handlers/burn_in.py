"""Burn-in before hand-off, and quarantined slots coming back.

An approved node (or one a provider admin re-runs) is ``burn_in``: its node-agent runs its checks
(``node_agent.burn_in``) and answers ``node_agent.burn_in_finished``; a pass makes the node schedulable, a
failure keeps it out of service as ``burn_in_failed`` with the failed checks named in ``review``. A result
for another run than the node's current one is stale and changes nothing. A re-run is refused while
allocations hold slots on the node (drain it first): the checks may reset its GPUs.

A quarantined slot (its wipe failed at release) returns to service only when a provider admin's re-wipe
succeeds (``node_agent.slot_rewiped`` ok); a failed re-wipe keeps it quarantined with the new reason.
"""
from __future__ import annotations

import uuid
from datetime import UTC, datetime

import structlog

from services.node_agent.contracts import BurnInFinished, RunBurnIn, SlotRewiped
from shared.unit_of_work import UnitOfWork

from .. import contracts as c
from .active import ActiveScheduler
from .common import Rejected, admin, emit_node, known_node
from .placing import place_waiting

log = structlog.get_logger()

_RERUN_FROM = ("schedulable", "burn_in", "burn_in_failed")


def start_burn_in(node_id: uuid.UUID, requested_by: uuid.UUID | None) -> dict:
    """A new run's record (the node's ``burn_in`` column)."""
    return {"run_id": str(uuid.uuid4()), "state": "running", "checks": [],
            "requested_by": str(requested_by) if requested_by else None,
            "started_at": datetime.now(UTC).isoformat(), "finished_at": None}


async def send_burn_in(ctx: UnitOfWork, node_id: uuid.UUID, run: dict) -> None:
    """Ask the node's agent to run it (the node-agent owns the command's model)."""
    await ctx.emit("node_agent.burn_in", RunBurnIn(node_id=node_id, run_id=run["run_id"],
                                                   requested_by=run["requested_by"]),
                   subject_params={"node_id": str(node_id)})


async def run_burn_in(ctx: UnitOfWork, cmd: c.RunBurnInRequest, *, active: ActiveScheduler) -> None:
    """A provider admin re-runs the burn-in: the node leaves service until it passes. Rejected: unknown node,
    no approved map, a status it cannot be re-run from, allocations on the node."""
    await active.ensure_loaded()
    store = active.repository(ctx.conn)

    async def body() -> None:
        node = await known_node(store, cmd.node_id)
        if node["approved_slot_map"] is None or node["status"] not in _RERUN_FROM:
            raise Rejected(f"node {cmd.node_id} is {node['status']}: a burn-in runs on an approved node "
                           f"({', '.join(_RERUN_FROM)})")
        held = await store.holdings_on(cmd.node_id)
        if held:
            raise Rejected(f"node {cmd.node_id} runs {held} allocation(s): drain it before a burn-in")
        run = start_burn_in(cmd.node_id, cmd.requested_by)
        await store.update_node(cmd.node_id, {"status": "burn_in", "burn_in": run, "review": []})
        active.apply_node(await store.node(cmd.node_id))
        await emit_node(ctx, store, cmd.node_id)
        await send_burn_in(ctx, cmd.node_id, run)
    await admin(ctx, store, "scheduler.run_burn_in", str(cmd.node_id), body)


async def burn_in_finished(ctx: UnitOfWork, evt: BurnInFinished, *, active: ActiveScheduler) -> None:
    """The node's burn-in result: schedulable on a pass, burn_in_failed naming the failed checks otherwise."""
    await active.ensure_loaded()
    store = active.repository(ctx.conn)
    node = await store.node(evt.node_id, lock=True)
    run = (node or {}).get("burn_in") or {}
    if node is None or node["status"] != "burn_in" or run.get("run_id") != str(evt.run_id):
        log.info("scheduler.burn_in_result_stale", node_id=str(evt.node_id), run_id=str(evt.run_id))
        return
    checks = [ch.model_dump(mode="json") for ch in evt.checks]
    failed = [f"burn-in check {ch.name} failed: {ch.detail}".strip() for ch in evt.checks if not ch.ok]
    if not evt.passed and not failed:
        failed = ["burn-in failed (no check named)"]
    run = {**run, "state": "passed" if evt.passed else "failed", "checks": checks, "finished_at": evt.at.isoformat()}
    await store.update_node(evt.node_id, {"status": "schedulable" if evt.passed else "burn_in_failed",
                                               "burn_in": run, "review": [] if evt.passed else failed})
    active.apply_node(await store.node(evt.node_id))
    await emit_node(ctx, store, evt.node_id)
    if evt.passed:
        await place_waiting(ctx, active)
    else:
        log.warning("scheduler.burn_in_failed", node_id=str(evt.node_id), failed=failed)


async def slot_rewiped(ctx: UnitOfWork, evt: SlotRewiped, *, active: ActiveScheduler) -> None:
    """A provider admin's re-wipe ran: a success returns the quarantined slot, a failure renews its reason."""
    await active.ensure_loaded()
    store = active.repository(ctx.conn)
    await store.node(evt.node_id, lock=True)
    if evt.ok:
        if not await store.return_slot(evt.node_id, evt.slot):
            return
        await ctx.emit("scheduler.slot_state_changed", c.SlotStateChanged(node_id=evt.node_id, slot=evt.slot,
                                                                          state="returned", reason="re-wipe passed"))
    else:
        reason = f"re-wipe failed: {evt.evidence.reason or 'unknown'}"[:2000]
        if not await store.renew_quarantine(evt.node_id, evt.slot, reason):
            return
    active.apply_node(await store.node(evt.node_id))
    await emit_node(ctx, store, evt.node_id)
    if evt.ok:
        await place_waiting(ctx, active)
