"""An allocation's node failed: ``allocation.interrupted`` (INTERRUPTED, being rescheduled) and
``allocation.rescheduled`` (ACTIVE again, on another node) into allocations_view, and into the allocation's
event stream, so its tenant sees both.

The view's ``interruption`` is the last one: what the tenant is told (category, reason, the node lost, when,
what happens next, the attempt), and once rescheduled the node it moved to and the gap. The two events of one
attempt arrive on separate consumers, in either order; ``domain.model.interruption_moves`` decides whether an
event moves the state, and the members of one attempt are merged whatever the order (a later attempt replaces
them). Each handler runs in the consumer's transaction (inbox dedupe included).
"""
from __future__ import annotations

import json
import uuid

import structlog

from services.allocation import contracts as ac
from shared.unit_of_work import UnitOfWork

from ...adapters import allocations as repo
from ...adapters.allocations import append_event
from ...domain.model import interruption_moves

log = structlog.get_logger()


def _shown(value) -> dict:
    return (json.loads(value) if isinstance(value, str) else dict(value)) if value else {}


async def _apply(ctx: UnitOfWork, allocation_id: uuid.UUID, attempt: int, rescheduled: bool, members: dict,
                 state: str, **fields) -> None:
    """Append the event; merge ``members`` into the interruption of ``attempt``; move the view to ``state`` (with
    ``fields``) when the event is the newest word on the allocation's node."""
    await append_event(ctx.conn, allocation_id, ctx.causation)
    row = await repo.get(ctx.conn, allocation_id, for_update=True)
    if row is None:
        log.warning("projection.unknown_allocation", allocation_id=str(allocation_id), type=ctx.causation.type)
        return
    shown = _shown(row["interruption"])
    shown_attempt = int(shown.get("attempt") or 0)
    if attempt < shown_attempt:
        log.info("projection.stale_interruption_ignored", allocation_id=str(allocation_id), attempt=attempt,
                 shown=shown_attempt)
        return
    moves = interruption_moves(row["state"], shown_attempt, bool(shown.get("rescheduled")), attempt, rescheduled)
    merged = {**(shown if attempt == shown_attempt else {}), **members, "attempt": attempt}
    merged["rescheduled"] = bool(merged.get("rescheduled")) or rescheduled
    changes: dict = {"interruption": json.dumps(merged)}
    if moves:
        changes.update({k: v for k, v in fields.items() if v is not None}, state=state)
    else:
        log.info("projection.stale_state_ignored", allocation_id=str(allocation_id), current=row["state"],
                 event_state=state)
    await repo.update(ctx.conn, allocation_id, **changes)


async def on_interrupted(ctx: UnitOfWork, data: ac.AllocationInterrupted) -> None:
    members = {"category": data.category, "reason": data.reason, "node_id": str(data.node_id),
               "interrupted_at": data.interrupted_at.isoformat(), "next": data.next}
    await _apply(ctx, data.allocation_id, data.attempt, False, members, "INTERRUPTED")


async def on_rescheduled(ctx: UnitOfWork, data: ac.AllocationRescheduled) -> None:
    members = {"node_id": str(data.from_node_id), "from_node_id": str(data.from_node_id),
               "to_node_id": str(data.to_node_id), "gap_s": data.gap_s, "interrupted_at": data.interrupted_at.isoformat()}
    instance = data.instance.model_dump_json() if data.instance else None
    await _apply(ctx, data.allocation_id, data.attempt, True, members, "ACTIVE", node_id=data.to_node_id,
                 instance=instance)
