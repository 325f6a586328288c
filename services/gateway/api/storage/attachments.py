"""Attaching a volume to a running allocation of the tenant, and detaching it (a live mount on its node).

The allocation must be the tenant's (a 404 otherwise, as for the volume) and ACTIVE on a node: before that, the
volume is named in the allocation request instead, and the saga mounts it. A volume that is not shared holds
one allocation at a time. The view shows the attachment 'attaching' (or 'detaching') until the storage
service's next document of the volume.
"""
from __future__ import annotations

import uuid

from aiohttp import web

from services.storage.contracts import AttachVolume, DetachVolume

from ...adapters import allocations
from ...adapters import volumes as repo
from ...http.auth import require_tenant_member
from ...http.endpoint import Endpoint, Param, respond
from ...http.inputs import path_uuid, read_body
from ...http.policy import tags
from ...http.problems import ProblemError, not_found
from ...http.state import gateway_of
from .schemas import AttachmentCreate, VolumeOut
from .volumes import VOLUME_ID, VOLUME_STATE, blocking_attachments, require_ready, volume_of, volume_out


async def _others_holding(conn, row, allocation_id: uuid.UUID, tenant_id: uuid.UUID) -> list[str]:
    """The other allocations the volume is attached to, or that asked to mount it and have not ended."""
    holders = {str(a["allocation_id"]) for a in blocking_attachments(row)}
    holders |= {str(a) for a in await repo.live_allocations_naming(conn, tenant_id, row["id"])}
    return sorted(holders - {str(allocation_id)})


async def attach_volume(request: web.Request) -> web.Response:
    p = require_tenant_member(request)
    body = await read_body(request, AttachmentCreate)
    gw = gateway_of(request)
    async with gw.unit_of_work("gateway.attach_volume") as uow:
        conn = uow.conn
        row = await volume_of(conn, request, p.tenant_id, for_update=True)
        alloc = await allocations.get(conn, body.allocation_id, p.tenant_id)
        if alloc is None:
            raise not_found("allocation")
        if alloc["state"] != "ACTIVE" or alloc["node_id"] is None:
            raise ProblemError(409, f"the allocation is {alloc['state']}; a volume is attached live only to an ACTIVE "
                                    "allocation: name the volume in the allocation request instead",
                               slug="allocation-not-active")
        require_ready(row, "attached")
        current = repo.attachments_of(row)
        if any(a["allocation_id"] == str(alloc["id"]) and a.get("state") != "failed" for a in current):
            raise ProblemError(409, "the volume is already attached to that allocation", slug="already-attached")
        others = await _others_holding(conn, row, alloc["id"], p.tenant_id)
        if others and not row["shared"]:
            raise ProblemError(409, f"the volume is not shared and is attached to allocation(s) {', '.join(others)}; "
                                    "detach it first (or create a shared volume)", slug="volume-in-use")
        ip_address = await repo.allocation_address(conn, alloc["id"])
        attaching = {"allocation_id": str(alloc["id"]), "mode": body.mode, "node_id": str(alloc["node_id"]),
                     "state": "attaching", "reason": None}
        row = await repo.set_attachments(conn, row["id"], [a for a in current if a["allocation_id"] != str(alloc["id"])]
                                         + [attaching])
        await uow.emit("storage.attach_volume", AttachVolume(
            volume_id=row["id"], tenant_id=p.tenant_id, allocation_id=alloc["id"], mode=body.mode,
            node_id=alloc["node_id"], ip_address=ip_address), correlation_id=str(alloc["id"]), tenant_id=p.tenant_id)
    return respond(volume_out(row), 202)


async def detach_volume(request: web.Request) -> web.Response:
    """202 and one detach_volume for an attachment; 202 again (nothing sent) while detaching."""
    p = require_tenant_member(request)
    gw = gateway_of(request)
    async with gw.unit_of_work("gateway.detach_volume") as uow:
        conn = uow.conn
        row = await volume_of(conn, request, p.tenant_id, for_update=True)
        allocation_id = str(path_uuid(request, "allocation_id", "attachment"))
        current = repo.attachments_of(row)
        found = next((a for a in current if a["allocation_id"] == allocation_id), None)
        if found is None:
            raise not_found("attachment")
        if found["state"] == "attaching":
            raise ProblemError(409, "the volume is still being attached; try again shortly", slug="attachment-not-ready")
        if found["state"] != "detaching":
            row = await repo.set_attachments(conn, row["id"], [
                {**a, "state": "detaching"} if a is found else a for a in current])
            await uow.emit("storage.detach_volume", DetachVolume(
                volume_id=row["id"], tenant_id=p.tenant_id, allocation_id=uuid.UUID(allocation_id)),
                correlation_id=allocation_id, tenant_id=p.tenant_id)
    return respond(volume_out(row), 202)


ATTACHED_ALLOCATION = Param("allocation_id", "path", "The allocation the volume is attached to.", uuid.UUID,
                            required=True)

async def attachment_resource(request: web.Request, data: dict, body) -> tuple[dict, dict]:
    """The policy resource of an attachment: the volume, the allocation and the mode."""
    return ({"volume_id": request.match_info["volume_id"], "allocation_id": str(body.allocation_id),
             "mode": body.mode}, tags(request, data))


ENDPOINTS = [
    Endpoint("POST", "/v1/volumes/{volume_id}/attachments", attach_volume, "attachVolume",
             "Attach a volume to a running allocation of the tenant", "storage", {202: VolumeOut},
             body=AttachmentCreate, params=(VOLUME_ID,), errors=(400, 401, 403, 404, 409, 413, 415, 422),
             description="The allocation must be ACTIVE (a 409 otherwise: name the volume in the allocation request "
                         "instead); another tenant's allocation is a 404. A volume that is not shared and is attached "
                         "elsewhere is a 409. Accepted with the attachment `attaching`; its node mounts it at "
                         "/mnt/<name> (`attached`), or the attachment shows `failed` with the reason.",
             policy_resource=attachment_resource),
    Endpoint("DELETE", "/v1/volumes/{volume_id}/attachments/{allocation_id}", detach_volume, "detachVolume",
             "Detach a volume from an allocation", "storage", {202: VolumeOut}, params=(VOLUME_ID, ATTACHED_ALLOCATION),
             errors=(401, 403, 404, 409),
             description="Accepted with the attachment `detaching`; its node unmounts it and the attachment goes. "
                         "Repeating it while detaching answers 202 again; while still attaching, a 409.",
             audit_state=VOLUME_STATE),
]
