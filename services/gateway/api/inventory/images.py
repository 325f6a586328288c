"""The image catalog: provider admins add and delete images; every signed-in caller lists the images it may
see (provider admins: all; a tenant's members: the public ones and their tenant's private ones).

Images are catalog data the gateway owns (like identity): no service is told of a change. An allocation
snapshots its image into the allocation.request command, so deleting an image never touches an allocation.
An image a caller may not see is a 404 (or, named by an allocation request, a 422), never a 403.
"""
from __future__ import annotations

import uuid

import asyncpg
import structlog
from aiohttp import web

from ...adapters import identity
from ...adapters import images as repo
from ...adapters.audit_state import StateReader, ids, select_object
from ...adapters.catalog import seen_as, visible_image
from ...http.auth import principal_of, require_provider_admin
from ...http.endpoint import Endpoint, Param, respond
from ...http.inputs import path_uuid, read_body
from ...http.paging import CURSOR, LIMIT, read_page
from ...http.problems import ProblemError, not_found, validation_problem
from ...http.schema_base import FieldError
from ...http.state import gateway_of
from .image_schemas import ImageCreate, ImageOut, ImagePage

log = structlog.get_logger()
IMAGE_ID = Param("image_id", "path", "The image's id.", uuid.UUID, required=True)


def image_out(row: asyncpg.Record) -> ImageOut:
    fields = {k: row[k] for k in ("id", "name", "os", "format", "source", "sha256", "min_disk_gb", "visibility",
                                  "tenant_id", "kernel", "initrd", "kernel_args", "created_at")}
    return ImageOut(**fields, default=row["is_default"], links={"self": f"/v1/images/{row['id']}"})


async def create_image(request: web.Request) -> web.Response:
    p = require_provider_admin(request)
    body = await read_body(request, ImageCreate)
    errors = body.rule_errors()
    if errors:
        raise validation_problem([FieldError(field=f, message=m, code="image_rule") for f, m in errors])
    image = {"id": uuid.uuid4(), **body.model_dump()}
    async with gateway_of(request).pool.acquire() as conn, conn.transaction():
        if body.tenant_id is not None and not await identity.tenant_exists(conn, body.tenant_id):
            raise validation_problem([FieldError(field="tenant_id", message=f"no tenant {body.tenant_id}",
                                                 code="unknown_tenant")], f"unknown tenant {body.tenant_id}")
        row = await repo.insert(conn, image, p.user_id)
    if row is None:
        raise ProblemError(409, f"an image named {body.name!r} already exists", slug="name-taken")
    log.info("audit.image_created", user_id=str(p.user_id), image_id=str(row["id"]), name=row["name"],
             visibility=row["visibility"], tenant=str(row["tenant_id"]) if row["tenant_id"] else None,
             default=row["is_default"])
    out = image_out(row)
    return respond(out, 201, headers={"Location": out.links.self})


async def list_images(request: web.Request) -> web.Response:
    p = principal_of(request)
    items, next_cursor = await read_page(request, lambda conn, n, after: repo.page(conn, seen_as(p), n, after))
    return respond(ImagePage(items=[image_out(r) for r in items], next_cursor=next_cursor))


async def get_image(request: web.Request) -> web.Response:
    p = principal_of(request)
    image_id = path_uuid(request, "image_id", "image")
    async with gateway_of(request).pool.acquire() as conn:
        row = await visible_image(conn, p, image_id=image_id)
    if row is None:
        raise not_found("image")
    return respond(image_out(row))


async def delete_image(request: web.Request) -> web.Response:
    p = require_provider_admin(request)
    image_id = path_uuid(request, "image_id", "image")
    async with gateway_of(request).pool.acquire() as conn:
        row = await repo.delete(conn, image_id)
    if row is None:
        raise not_found("image")
    log.info("audit.image_deleted", user_id=str(p.user_id), image_id=str(image_id), name=row["name"],
             default=row["is_default"])
    return web.Response(status=204)


_IMAGE = StateReader(select_object("images", "id = $1", "name", "os", "format", "visibility", "tenant_id",
                                   "min_disk_gb", "is_default"), ids("image_id"))


ENDPOINTS = [
    Endpoint("POST", "/v1/images", create_image, "createImage", "Add an image to the catalog (provider admin)", "images",
             {201: ImageOut}, body=ImageCreate, errors=(400, 401, 403, 409, 413, 415, 422),
             headers={201: {"Location": "The image (/v1/images/{id})."}},
             description="A name already in the catalog is a 409; a private image's tenant_id must name an existing "
                         "tenant (a 422 naming it). `default: true` makes it the image an allocation naming none "
                         "boots, taking the mark from the previous default (only a public image can be the "
                         "default). The nodes fetch `source` (and `kernel`, `initrd`) and check `sha256` when they "
                         "boot it."),
    Endpoint("GET", "/v1/images", list_images, "listImages", "List the images the caller may boot, newest first",
             "images", {200: ImagePage}, params=(LIMIT, CURSOR), errors=(401, 422),
             description="Provider admins see every image; a tenant's members the public images and their tenant's "
                         "private ones."),
    Endpoint("GET", "/v1/images/{image_id}", get_image, "getImage", "Read an image", "images", {200: ImageOut},
             params=(IMAGE_ID,), errors=(401, 404), description="An image the caller may not see is a 404."),
    Endpoint("DELETE", "/v1/images/{image_id}", delete_image, "deleteImage", "Delete an image (provider admin)", "images",
             {204: None}, params=(IMAGE_ID,), errors=(401, 403, 404),
             description="Allocations that boot it keep their snapshot of it; new requests can no longer name it. "
                         "Deleting the default image leaves the catalog without a default.",
             audit_state=_IMAGE),
]
