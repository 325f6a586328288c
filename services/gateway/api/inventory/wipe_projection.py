"""The node-agents' wipe evidence into the gateway's tables (``adapters.wipes``), for GET
/v1/allocations/{id}/wipe: a release's wipe (``node_agent.slots_wiped``, the release saga's wipe_slots reply, from
every node) and a provider admin's re-wipe of a quarantined slot (``node_agent.slot_rewiped``).

Each handler runs in the consumer's transaction (inbox dedupe included); a redelivered or repeated report changes
nothing. A release's wipe is also appended to the allocation's event stream. A slot is recorded as failed when its
wipe failed or the node-agent quarantined it (the reason: the quarantine's, else the wipe's).
"""
from __future__ import annotations

import structlog

from services.node_agent.contracts import SlotRewiped, SlotsWiped
from shared.unit_of_work import UnitOfWork

from ...adapters.allocations import append_event
from . import wipe_views as repo

log = structlog.get_logger()


async def on_slots_wiped(ctx: UnitOfWork, data: SlotsWiped) -> None:
    quarantine = {q.slot: q.reason for q in data.quarantine}
    slots = [{"slot": e.slot, "ok": e.ok and e.slot not in quarantine, "reason": quarantine.get(e.slot) or e.reason,
              "evidence": e.model_dump(mode="json")} for e in data.evidence]
    await append_event(ctx.conn, data.allocation_id, ctx.causation)
    recorded = await repo.record_release(ctx.conn, data.allocation_id, data.node_id, ctx.causation.id,
                                         [q.model_dump(mode="json") for q in data.quarantine], slots)
    if not recorded:
        log.info("projection.wipe_already_recorded", allocation_id=str(data.allocation_id))
        return
    failed = sorted(s["slot"] for s in slots if not s["ok"])
    (log.warning if failed else log.info)("projection.slots_wiped", allocation_id=str(data.allocation_id),
                                          node_id=str(data.node_id), slots=[s["slot"] for s in slots],
                                          quarantined=failed)


async def on_slot_rewiped(ctx: UnitOfWork, data: SlotRewiped) -> None:
    allocation_id = await repo.quarantined_by(ctx.conn, data.node_id, data.slot)
    recorded = await repo.record_rewipe(
        ctx.conn, data.request_id, data.node_id, data.slot, data.ok, None if data.ok else data.evidence.reason,
        data.evidence.model_dump(mode="json"), data.requested_by, ctx.causation.id, allocation_id)
    if recorded:
        log.info("projection.slot_rewiped", node_id=str(data.node_id), slot=data.slot, ok=data.ok,
                 request_id=str(data.request_id), allocation_id=str(allocation_id) if allocation_id else None)
