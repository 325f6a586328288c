"""Tenant volumes (tenant members): create, list, read, grow, delete.

Writes are accepted with 202 and travel to the storage service as commands through the outbox; the read model
shows 'creating' (or the pending size, or 'deleting') until the service answers with the volume's new document
(``projection``), or refuses (state 'rejected', or the reason). Another tenant's volume, or a malformed
id, is a 404, never a 403, and is never listed. A creation or a growth is charged against the tenant's and the
user's storage quota atomically first (``storage_quotas.charge``): over it is a 403 quota-exceeded and nothing
is sent.
"""
from __future__ import annotations

import uuid

import asyncpg
from aiohttp import web

from services.storage.contracts import CreateVolume, DestroyVolume, ResizeVolume

from ...adapters import volumes as repo
from ...adapters.admission import QuotaProblem, charge, offered_class
from ...adapters.audit_state import StateReader, ids, select_object
from ...domain.volumes import READY, mount_point, volume_links
from ...http.auth import require_tenant_member
from ...http.endpoint import Endpoint, Param, respond
from ...http.inputs import path_uuid, read_body
from ...http.paging import CURSOR, LIMIT, read_page
from ...http.policy import tags
from ...http.problems import ProblemError, not_found, validation_problem
from ...http.schema_base import FieldError, Problem
from ...http.state import gateway_of
from .schemas import VolumeCreate, VolumeOut, VolumePage, VolumeResize


def volume_out(row: asyncpg.Record | dict) -> VolumeOut:
    fields = {k: row[k] for k in ("id", "tenant_id", "user_id", "name", "storage_class", "backend", "size_bytes",
                                  "used_bytes", "shared", "scratch", "state", "reason", "created_at", "updated_at")}
    pending = row["pending_size_bytes"]
    return VolumeOut(**fields, requested_size_bytes=pending if pending and pending > row["size_bytes"] else None,
                     attachments=repo.attachments_of(row), mount_point=mount_point(row["name"]),
                     links=volume_links(row["id"]))


async def volume_of(conn: asyncpg.Connection, request: web.Request, tenant_id: uuid.UUID, *,
                    for_update: bool = False) -> asyncpg.Record:
    """The path's volume if it is the tenant's and not deleted; 404 otherwise."""
    row = await repo.get(conn, path_uuid(request, "volume_id", "volume"), tenant_id, for_update=for_update)
    if row is None:
        raise not_found("volume")
    return row


def _too_large(size: int, max_bytes: int, storage_class: str) -> ProblemError:
    return validation_problem([FieldError(field="size_bytes", code="less_than_equal",
                                          message=f"must be at most {max_bytes}, the largest volume of class "
                                                  f"{storage_class!r}")])


async def create_volume(request: web.Request) -> web.Response:
    p = require_tenant_member(request)
    body = await read_body(request, VolumeCreate)
    gw, volume_id = gateway_of(request), uuid.uuid4()
    async with gw.unit_of_work("gateway.create_volume") as uow:
        conn = uow.conn
        offer, cls = await offered_class(conn, body.storage_class)
        if body.size_bytes > cls.max_volume_bytes:
            raise _too_large(body.size_bytes, cls.max_volume_bytes, cls.name)
        await repo.lock_tenant(conn, p.tenant_id)
        if await repo.live_named(conn, p.tenant_id, body.name) is not None:
            raise ProblemError(409, f"a volume named {body.name!r} already exists", slug="name-taken")
        await charge(conn, p.tenant_id, p.user_id, cls.name, offer, requested_bytes=body.size_bytes,
                     requested_volumes=1)
        row = await repo.request_volume(conn, volume_id, p.tenant_id, p.user_id, body.name, cls.name, cls.backend,
                                        body.size_bytes, body.shared)
        await uow.emit("storage.create_volume", CreateVolume(
            volume_id=volume_id, tenant_id=p.tenant_id, user_id=p.user_id, name=body.name, storage_class=cls.name,
            size_bytes=body.size_bytes, shared=body.shared), correlation_id=str(volume_id), tenant_id=p.tenant_id)
    return respond(volume_out(row), 202, headers={"Location": volume_links(volume_id)["self"]})


async def list_volumes(request: web.Request) -> web.Response:
    p = require_tenant_member(request)
    items, next_cursor = await read_page(request, lambda conn, n, after: repo.page(conn, p.tenant_id, n, after))
    return respond(VolumePage(items=[volume_out(r) for r in items], next_cursor=next_cursor))


async def get_volume(request: web.Request) -> web.Response:
    p = require_tenant_member(request)
    async with gateway_of(request).pool.acquire() as conn:
        row = await volume_of(conn, request, p.tenant_id)
    return respond(volume_out(row))


def require_ready(row: asyncpg.Record, doing: str) -> None:
    """409 unless the volume is available or in use, and not an allocation's scratch volume."""
    if row["scratch"]:
        raise ProblemError(409, f"a scratch volume lives and dies with its allocation; it cannot be {doing}",
                           slug="volume-is-scratch")
    if row["state"] not in READY:
        raise ProblemError(409, f"the volume is {row['state']}; only an available or in-use volume can be {doing}",
                           slug="volume-not-ready")


async def resize_volume(request: web.Request) -> web.Response:
    """Grow only: a size not above the current one is a 422; the growth is charged against the quota."""
    p = require_tenant_member(request)
    body = await read_body(request, VolumeResize)
    gw = gateway_of(request)
    async with gw.unit_of_work("gateway.resize_volume") as uow:
        conn = uow.conn
        row = await volume_of(conn, request, p.tenant_id, for_update=True)
        require_ready(row, "resized")
        if body.size_bytes <= row["size_bytes"]:
            raise validation_problem([FieldError(field="size_bytes", code="grow_only", message=(
                f"must be larger than the current size {row['size_bytes']}: volumes only grow"))])
        offer = await repo.offer(conn)
        cls = offer.find(row["storage_class"])
        if cls is not None and body.size_bytes > cls.max_volume_bytes:
            raise _too_large(body.size_bytes, cls.max_volume_bytes, cls.name)
        held = max(row["size_bytes"], row["pending_size_bytes"] or 0)
        # the growth is charged to the user who created the volume (whose share holds it)
        await charge(conn, p.tenant_id, row["user_id"] or p.user_id, row["storage_class"], offer,
                     requested_bytes=max(0, body.size_bytes - held), requested_volumes=0)
        row = await repo.request_resize(conn, row["id"], body.size_bytes)
        await uow.emit("storage.resize_volume", ResizeVolume(
            volume_id=row["id"], tenant_id=p.tenant_id, request_id=uuid.uuid4(), size_bytes=body.size_bytes),
            correlation_id=str(row["id"]), tenant_id=p.tenant_id)
    return respond(volume_out(row), 202)


def blocking_attachments(row: asyncpg.Record) -> list[dict]:
    """The attachments that hold the volume (a failed one does not)."""
    return [a for a in repo.attachments_of(row) if a.get("state") != "failed"]


async def delete_volume(request: web.Request) -> web.Response:
    """202 and one destroy_volume for a volume nothing holds; 202 again (nothing sent) while deleting. A volume the
    service rejected (never made) is simply gone: 202, nothing sent, then 404."""
    p = require_tenant_member(request)
    gw = gateway_of(request)
    async with gw.unit_of_work("gateway.delete_volume") as uow:
        conn = uow.conn
        row = await volume_of(conn, request, p.tenant_id, for_update=True)
        if row["state"] == "creating":
            raise ProblemError(409, "the volume is still being created; try again shortly", slug="volume-not-ready")
        if row["state"] == "rejected":
            row = await repo.set_state(conn, row["id"], "deleted")
        elif row["state"] != "deleting":
            holders = [a["allocation_id"] for a in blocking_attachments(row)]
            holders += [str(a) for a in await repo.live_allocations_naming(conn, p.tenant_id, row["id"])]
            if holders:
                raise ProblemError(409, f"the volume is attached to (or requested by) allocation(s) "
                                        f"{', '.join(sorted(set(holders)))}; detach it or release them first",
                                   slug="volume-in-use")
            row = await repo.set_state(conn, row["id"], "deleting")
            await uow.emit("storage.destroy_volume", DestroyVolume(volume_id=row["id"], tenant_id=p.tenant_id),
                           correlation_id=str(row["id"]), tenant_id=p.tenant_id)
    return respond(volume_out(row), 202)


VOLUME_ID = Param("volume_id", "path", "The volume's id.", uuid.UUID, required=True)
_BODY_ERRORS = (400, 401, 403, 404, 409, 413, 415, 422)
_QUOTA = {403: (Problem, QuotaProblem)}

async def volume_resource(request: web.Request, data: dict, body) -> tuple[dict, dict]:
    """The policy resource of a POST /v1/volumes: its name, size, sharing and class."""
    attrs = {"name": body.name, "size_bytes": body.size_bytes, "shared": body.shared}
    if body.storage_class:
        attrs["storage_class"] = body.storage_class
    return attrs, tags(request, data)


VOLUME_STATE = StateReader(select_object("volumes_view", "id = $1", "name", "storage_class", "size_bytes",
                                         "pending_size_bytes", "state", "attachments", "version"), ids("volume_id"))


ENDPOINTS = [
    Endpoint("POST", "/v1/volumes", create_volume, "createVolume", "Create a volume of the tenant", "storage",
             {202: VolumeOut}, body=VolumeCreate, errors=(400, 401, 403, 409, 413, 415, 422), problems=_QUOTA,
             headers={202: {"Location": "The volume (/v1/volumes/{id})."}},
             description="Accepted as `creating`; the storage service makes it (state `available`) or refuses it "
                         "(state `rejected`, with the reason). Rules the schema cannot state (they depend on what "
                         "the provider offers and the tenant holds): `storage_class` is a class GET "
                         "/v1/storage-classes lists, or, left out, the default class must be offered (a 422 on "
                         "`storage_class`); `size_bytes` is at most that class's `max_volume_bytes` (a 422); `name` "
                         "is not used by a live volume of the tenant (a 409); the size fits the tenant's (and the "
                         "user's) storage quota in the class (else 403 `quota-exceeded` with the members quota, "
                         "e.g. `storage:standard:bytes`, limit, used and requested).",
             policy_resource=volume_resource),
    Endpoint("GET", "/v1/volumes", list_volumes, "listVolumes", "List the tenant's volumes, newest first", "storage",
             {200: VolumePage}, params=(LIMIT, CURSOR), errors=(401, 403, 422)),
    Endpoint("GET", "/v1/volumes/{volume_id}", get_volume, "getVolume", "Read a volume and its attachments", "storage",
             {200: VolumeOut}, params=(VOLUME_ID,), errors=(401, 403, 404)),
    Endpoint("PATCH", "/v1/volumes/{volume_id}", resize_volume, "resizeVolume", "Grow a volume", "storage",
             {202: VolumeOut}, body=VolumeResize, params=(VOLUME_ID,), errors=_BODY_ERRORS, problems=_QUOTA,
             description="The new size shows as `requested_size_bytes` until the storage service applied it. "
                         "Rules the schema cannot state (they depend on the volume): `size_bytes` is larger than the "
                         "volume's current size (volumes only grow; a 422); it is at most the volume's class's "
                         "`max_volume_bytes` (a 422); the growth fits the storage quota (else 403 "
                         "`quota-exceeded`). A scratch volume, or one not available or in use, is a 409.",
             audit_state=VOLUME_STATE),
    Endpoint("DELETE", "/v1/volumes/{volume_id}", delete_volume, "deleteVolume", "Delete a volume and its data",
             "storage", {202: VolumeOut}, params=(VOLUME_ID,), errors=(401, 403, 404, 409),
             description="A volume still being created, attached, or named by an allocation that has not ended is a "
                         "409. Accepted as `deleting`; once deleted it is a 404 and no longer listed.",
             audit_state=VOLUME_STATE),
]
