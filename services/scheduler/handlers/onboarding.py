"""Node onboarding: declare (gateway), report topology (node-agent), approve the slot map (provider admin),
and later changes (pool, labels, taints, cordon).

The gate: nothing on a node is schedulable until an admin approves the proposal that discovery produced,
naming its number (a stale number is rejected). A report that differs from the approved map puts the node
into ``needs_review`` (no new placements; running allocations untouched) with a new proposal to approve.
Register and report may arrive in either order. Every change emits ``scheduler.node_changed``.
"""
from __future__ import annotations

import json
from dataclasses import replace

from shared.unit_of_work import UnitOfWork

from .. import contracts as c
from ..domain.topology import NodeTopology, SlotMap, TopologyError, compare, derive_slot_map
from .active import ActiveScheduler
from .burn_in import send_burn_in, start_burn_in
from .common import Rejected, admin, emit_node, known_node
from .health import end_drain
from .placing import place_waiting

_DECLARED = ("name", "gpu_model", "gpu_count", "labels", "pool", "region", "site", "rack")


def _declared(cmd: c.RegisterNode) -> dict:
    return {k: getattr(cmd, k) for k in _DECLARED}


async def register_node(ctx: UnitOfWork, cmd: c.RegisterNode, *, active: ActiveScheduler) -> None:
    """Declare a node (idempotent: the same declaration again changes nothing). A node known so far only
    from its topology report takes the declaration. Rejected: a name another node has, another
    declaration under a declared id, an unknown pool."""
    await active.ensure_loaded()
    store = active.repository(ctx.conn)
    async def body() -> None:
        if not await store.pool_exists(cmd.pool):
            raise Rejected(f"unknown pool {cmd.pool!r}")
        node = await store.node(cmd.node_id, lock=True)
        holder = await store.node_name_holder(cmd.name)
        if holder is not None and holder != cmd.node_id:
            raise Rejected(f"node name {cmd.name!r} is taken by node {holder}")
        if node is None:
            if not await store.insert_node(cmd.node_id, _declared(cmd)):
                raise Rejected(f"node name {cmd.name!r} was taken by another node meanwhile")
        elif node["declared"]:
            diff = [k for k in _DECLARED if node[k] != getattr(cmd, k)]
            if diff:
                raise Rejected(f"node {cmd.node_id} is registered with other {', '.join(diff)}")
            return   # the same declaration again: nothing to do
        else:
            await store.update_node(cmd.node_id, {**_declared(cmd), "declared": True})
        await ctx.emit("scheduler.node_registered", c.NodeRegistered(
            node_id=cmd.node_id, name=cmd.name, gpu_model=cmd.gpu_model, gpu_count=cmd.gpu_count))
        active.apply_node(await store.node(cmd.node_id))
        await emit_node(ctx, store, cmd.node_id)
    await admin(ctx, store, "scheduler.register_node", str(cmd.node_id), body)


def _parse(topology: dict) -> NodeTopology:
    try:
        t = NodeTopology.from_dict(topology)
    except TopologyError as exc:
        raise Rejected(f"bad topology: {exc}") from None
    if not t.gpus:
        raise Rejected("bad topology: no GPUs")
    return t


def _discovery_fields(node: dict | None, t: NodeTopology, cmd: c.ReportTopology) -> dict:
    """The node's new status, proposal and review after this discovery."""
    fields = {"topology": t.to_dict(), "driver": cmd.driver}
    approved = SlotMap.from_dict(node["approved_slot_map"]) if node and node["approved_slot_map"] else None
    differences = compare(approved, t) if approved is not None else []
    if approved is not None and not differences:
        return {**fields, "status": "schedulable", "review": [], "proposed_slot_map": None}
    proposed, problems = derive_slot_map(t)
    if node and node.get("declared") is not False:
        found = (len(t.gpus), t.gpus[0].model)
        if (node["gpu_count"], node["gpu_model"]) != found:   # shown to the admin; approval adopts what was found
            problems.append(f"declared {node['gpu_count']} x {node['gpu_model']}, discovered {found[0]} x {found[1]}")
    return {**fields, "status": "needs_review" if approved is not None else "pending_approval",
            "review": differences + problems, "proposed_slot_map": proposed.to_dict(),
            "proposal": (node["proposal"] if node else 0) + 1}


async def report_topology(ctx: UnitOfWork, cmd: c.ReportTopology, *, active: ActiveScheduler) -> None:
    """Store what discovery found and derive a proposed slot map (idempotent: the same topology again
    changes nothing). Rejected: a malformed topology."""
    await active.ensure_loaded()
    store = active.repository(ctx.conn)
    async def body() -> None:
        t = _parse(cmd.topology)
        node = await store.node(cmd.node_id, lock=True)
        if node is not None and node["topology"] == t.to_dict() and node["driver"] == cmd.driver:
            return
        fields = _discovery_fields(node, t, cmd)
        if node is None:   # reported before it was declared: known by id until the admin declares it
            await store.insert_node(cmd.node_id, {"name": f"undeclared-{cmd.node_id}", "gpu_model": t.gpus[0].model,
                                                       "gpu_count": len(t.gpus), "declared": False, **fields})
        else:
            await store.update_node(cmd.node_id, fields)
        active.apply_node(await store.node(cmd.node_id))
        await emit_node(ctx, store, cmd.node_id)
    await admin(ctx, store, "scheduler.report_topology", str(cmd.node_id), body)


def _approved_map(node: dict, cmd: c.ApproveSlotMap) -> SlotMap:
    slot_map = SlotMap.from_dict(node["proposed_slot_map"])
    if cmd.wipe_policy is not None:
        slot_map = SlotMap(tuple(replace(s, wipe_policy=cmd.wipe_policy or None) for s in slot_map.slots))
    return slot_map


async def approve_slot_map(ctx: UnitOfWork, cmd: c.ApproveSlotMap, *, active: ActiveScheduler) -> None:
    """Approve the node's current proposal: its slots become schedulable (those with a wipe policy) once the
    node passed its burn-in (sent here, when burn-in is on; see handlers/burn_in.py).
    Rejected: unknown node, no proposal, a proposal number that is not the current one."""
    await active.ensure_loaded()
    store = active.repository(ctx.conn)
    async def body() -> None:
        node = await known_node(store, cmd.node_id)
        if node["proposed_slot_map"] is None:
            raise Rejected(f"node {cmd.node_id} has no slot-map proposal awaiting approval")
        if cmd.proposal != node["proposal"]:
            raise Rejected(f"stale proposal {cmd.proposal}: the current proposal of node {cmd.node_id} is "
                           f"{node['proposal']}")
        slot_map = _approved_map(node, cmd)
        doc = slot_map.to_dict()
        await store.install_slots(cmd.node_id, json.loads(json.dumps(doc["slots"])))
        # the approved hardware is what the node is from now on (the declaration was the admin's expectation)
        burn_in = start_burn_in(cmd.node_id, cmd.approved_by) if active.settings.burn_in else None
        await store.update_node(cmd.node_id, {"approved_slot_map": doc, "proposed_slot_map": None,
                                                   "status": "burn_in" if burn_in else "schedulable", "review": [],
                                                   **({"burn_in": burn_in} if burn_in else {}),
                                                   "gpu_model": slot_map.slots[0].gpu_model if slot_map.slots
                                                   else node["gpu_model"], "gpu_count": len(slot_map.slots) or
                                                   node["gpu_count"]})
        active.apply_node(await store.node(cmd.node_id))
        await emit_node(ctx, store, cmd.node_id)
        if burn_in:
            await send_burn_in(ctx, cmd.node_id, burn_in)
        else:
            await place_waiting(ctx, active)
    await admin(ctx, store, "scheduler.approve_slot_map", str(cmd.node_id), body)


async def update_node(ctx: UnitOfWork, cmd: c.UpdateNode, *, active: ActiveScheduler) -> None:
    """Change pool, labels, taints or cordon. Cordon stops new placements only. Rejected: unknown node
    or pool."""
    await active.ensure_loaded()
    store = active.repository(ctx.conn)
    async def body() -> None:
        await known_node(store, cmd.node_id)
        if cmd.pool is not None and not await store.pool_exists(cmd.pool):
            raise Rejected(f"unknown pool {cmd.pool!r}")
        fields = {k: getattr(cmd, k) for k in ("pool", "labels", "taints", "cordoned") if getattr(cmd, k) is not None}
        if not fields:
            raise Rejected("nothing to change")
        await store.update_node(cmd.node_id, fields)
        active.apply_node(await store.node(cmd.node_id))
        await emit_node(ctx, store, cmd.node_id)
        if cmd.cordoned is False:
            await end_drain(ctx, cmd.node_id)
        await place_waiting(ctx, active)
    await admin(ctx, store, "scheduler.update_node", str(cmd.node_id), body)
