"""Wipe-on-release: the evidence of an allocation's slot wipes (its tenant and provider admins read it), and a
provider admin's re-wipe of a quarantined slot.

The release saga has the node-agent wipe the allocation's slots before they return to the pool; the evidence
(``node_agent.slots_wiped``) is projected by ``wipe_projection``. A slot whose wipe failed is quarantined by
the scheduler (the node's document lists it); a re-wipe (``node_agent.rewipe``) that passes returns it, its
evidence (``node_agent.slot_rewiped``) showing on the allocation whose release left the slot quarantined.
"""
from __future__ import annotations

import uuid

import structlog
from aiohttp import web
from pydantic import ValidationError

from services.node_agent.contracts import Rewipe
from services.scheduler.contracts import SlotDetail

from ...adapters import allocations as views
from ...adapters import inventory
from ...http.auth import principal_of, require_provider_admin
from ...http.endpoint import Endpoint, Param, respond
from ...http.inputs import path_uuid, path_value
from ...http.params import ALLOCATION_ID, NODE_ID
from ...http.problems import ProblemError, forbidden, not_found
from ...http.schema_base import integer
from ...http.state import gateway_of
from . import wipe_views as repo
from .wipe_schemas import AllocationWipe, RewipeAccepted, SlotWipe

log = structlog.get_logger()
MAX_SLOT = 1023
SLOT = Param("slot", "path", "The slot's index (as the node's slot map numbers it).", integer(0, MAX_SLOT),
             required=True)
RELEASING = ("RELEASING", "RELEASED")


def wipe_status(state: str, wipe: dict | None, slots: list[dict]) -> str:
    """not_released, wiping, wiped or quarantined (see ``AllocationWipe``)."""
    if wipe is None and not slots:
        return "wiping" if state in RELEASING else "not_released"
    latest = {s["slot"]: s["ok"] for s in slots}
    listed = {q.get("slot") for q in (wipe or {}).get("quarantine") or []}
    failed = any(not ok for ok in latest.values()) or any(slot not in latest for slot in listed)
    return "quarantined" if failed else "wiped"


async def allocation_wipe(request: web.Request) -> web.Response:
    p = principal_of(request)
    if not (p.is_provider_admin or p.may_use_allocations):
        raise forbidden("an allocation's wipe is read by its tenant or a provider admin")
    allocation_id = path_uuid(request, "allocation_id", "allocation")
    async with gateway_of(request).pool.acquire() as conn:
        row = await views.get(conn, allocation_id, None if p.is_provider_admin else p.tenant_id)
        if row is None:
            raise not_found("allocation")
        wipe, slots = await repo.of_allocation(conn, allocation_id)
    return respond(AllocationWipe(
        allocation_id=allocation_id, status=wipe_status(row["state"], wipe, slots),
        node_id=wipe["node_id"] if wipe else row["node_id"], slots=[SlotWipe.shown(s) for s in slots],
        wiped_at=wipe["recorded_at"] if wipe else None))


def slot_detail(slot_map: dict | None, slot: int) -> SlotDetail | None:
    """The slot as the node's approved slot map describes it (its devices and wipe policy), if it does."""
    for entry in (slot_map or {}).get("slots") or []:
        if isinstance(entry, dict) and entry.get("index") == slot:
            try:
                return SlotDetail.model_validate({k: entry[k] for k in SlotDetail.model_fields if k in entry})
            except ValidationError:
                return None
    return None


async def rewipe_slot(request: web.Request) -> web.Response:
    admin = require_provider_admin(request)
    node_id = path_uuid(request, "node_id", "node")
    slot = path_value(request, SLOT)
    gw, request_id = gateway_of(request), uuid.uuid4()
    async with gw.unit_of_work("gateway.rewipe_slot") as uow:
        node = await inventory.get_node(uow.conn, node_id)
        if node is None:
            raise not_found("node")
        if slot not in {q.get("slot") for q in node["quarantined"] or []}:
            raise ProblemError(409, f"slot {slot} of node {node_id} is not quarantined; only a quarantined slot is "
                                    "re-wiped", slug="slot-not-quarantined")
        await uow.emit("node_agent.rewipe", Rewipe(
            request_id=request_id, node_id=node_id, slot=slot, slot_detail=slot_detail(node["approved_slot_map"], slot),
            requested_by=admin.user_id), correlation_id=str(node_id), subject_params={"node_id": str(node_id)})
    log.info("audit.slot_rewipe_requested", user_id=str(admin.user_id), node_id=str(node_id), slot=slot,
             request_id=str(request_id))
    return respond(RewipeAccepted(request_id=request_id, node_id=node_id, slot=slot, requested_by=admin.user_id), 202)


ENDPOINTS = [
    Endpoint("GET", "/v1/allocations/{allocation_id}/wipe", allocation_wipe, "getAllocationWipe",
             "Read the evidence of the allocation's slot wipes", "allocations", {200: AllocationWipe},
             params=(ALLOCATION_ID,), errors=(401, 403, 404),
             description="For the allocation's tenant and provider admins. Every slot is wiped at release before "
                         "it returns to the pool: `status` is `not_released` (the allocation is not releasing or "
                         "released), `wiping` (no evidence yet), `wiped` (every slot's wipe passed) or "
                         "`quarantined` (some slot's wipe failed: its entry says why; the slot stays out of "
                         "service until a provider admin's re-wipe passes, which then shows as that slot's "
                         "evidence). Each slot: the devices erased, the method, bytes, duration and how it was "
                         "verified."),
    Endpoint("POST", "/v1/nodes/{node_id}/slots/{slot}/rewipe", rewipe_slot, "rewipeSlot",
             "Wipe a quarantined slot again (provider admin)", "nodes", {202: RewipeAccepted},
             params=(NODE_ID, SLOT), errors=(401, 403, 404, 409, 422),
             description="Only a slot the node's document lists in `quarantined` (else 409 `slot-not-quarantined`). "
                         "Sent to the node's agent (node_agent.rewipe); a pass returns the slot to service (it "
                         "leaves `quarantined`), a failure keeps it there with the new reason. The evidence shows "
                         "on the allocation whose release left the slot quarantined (GET .../wipe)."),
]
