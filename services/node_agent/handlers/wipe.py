"""The wipe of a slot's disks and GPU: the wipe of released slots (a release saga step) and a provider admin's
re-wipe of a quarantined slot.

The wipe never fails the step for a slot whose wipe failed: that is an outcome, recorded as evidence and
answered in ``quarantine`` (the scheduler keeps the slot out of service). An error no wipe outcome covers
(the database, the bus) propagates and the command is retried.
"""
from __future__ import annotations

import asyncio
from functools import partial

import structlog

from shared.participant import invoke, over
from shared.refusals import PermanentError
from shared.unit_of_work import UnitOfWork

from .. import contracts as c
from ..domain.ports import NodeRecords
from ..domain.wipe import DEFAULT_POLICY
from .node import Node

log = structlog.get_logger()


async def _wipe_one(node: Node, slot: int, detail) -> c.SlotWipe:
    policy = (detail.wipe_policy if detail is not None else None) or DEFAULT_POLICY
    ev = await node.wiper.wipe_slot(slot, nvme_pci=detail.nvme_pci if detail else None,
                                    gpu_pci=detail.gpu_pci if detail else None, policy=policy)
    return c.SlotWipe.model_validate(ev.to_dict())


async def wipe_step(records: NodeRecords, cmd: c.WipeSlots, *, node: Node) -> dict:
    """The step's effect: every slot named (in ``slots`` or ``slot_details``) wiped at once, its evidence recorded;
    returns the reply's fields, with the slots whose wipe failed in ``quarantine``."""
    details = {d.index: d for d in cmd.slot_details}
    slots = sorted(set(cmd.slots) | set(details))
    evidence = list(await asyncio.gather(*(_wipe_one(node, s, details.get(s)) for s in slots)))
    await records.record_wipes(evidence, allocation_id=cmd.allocation_id)
    quarantine = [{"slot": e.slot, "reason": e.reason or "wipe failed"} for e in evidence if not e.ok]
    for e in evidence:
        (log.warning if not e.ok else log.info)("node_agent.slot_wiped", allocation_id=str(cmd.allocation_id),
                                                slot=e.slot, ok=e.ok, reason=e.reason,
                                                method=[d.method for d in e.devices], seconds=e.duration_s)
    return {"node_id": node.id, "evidence": [e.model_dump(mode="json") for e in evidence], "quarantine": quarantine}


async def wipe_slots(ctx: UnitOfWork, cmd: c.WipeSlots, *, node: Node) -> None:
    """Release step: wipe each slot once per idempotency key; replies slots_wiped with the evidence."""
    if cmd.node_id != node.id:
        raise PermanentError(f"wipe for node {cmd.node_id} arrived at node {node.id}")
    await invoke(ctx, cmd, over(node.records, partial(wipe_step, node=node)), step=c.WIPE_SLOTS,
                 subject_params=node.subject_params)


async def rewipe(ctx: UnitOfWork, cmd: c.Rewipe, *, node: Node) -> None:
    """A provider admin's re-wipe of a quarantined slot: always answers slot_rewiped, ok or not."""
    if cmd.node_id != node.id:
        raise PermanentError(f"re-wipe for node {cmd.node_id} arrived at node {node.id}")
    evidence = await _wipe_one(node, cmd.slot, cmd.slot_detail)
    await node.records(ctx.conn).record_wipes([evidence], request_id=cmd.request_id)
    log.info("node_agent.slot_rewiped", slot=cmd.slot, ok=evidence.ok, reason=evidence.reason,
             requested_by=str(cmd.requested_by))
    await ctx.emit("node_agent.slot_rewiped", c.SlotRewiped(
        request_id=cmd.request_id, node_id=node.id, slot=cmd.slot, ok=evidence.ok, evidence=evidence,
        requested_by=cmd.requested_by), subject_params=node.subject_params)
