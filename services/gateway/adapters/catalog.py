"""What a create request names from the catalog: its shape (the usable shapes of shapes_view) and its image (one
the caller may see, or the catalog's default). The allocations slice resolves both, and so does the policy resource
of an allocation; the inventory slice lists and manages them."""
from __future__ import annotations

import re
import uuid

import asyncpg

from services.node_agent.contracts import ImageRef

from ..domain.guest import may_see_image
from ..domain.model import Principal
from ..domain.scheduling import ShapeInfo, usable_shapes
from ..http.problems import printable, validation_problem
from ..http.schema_base import UUID_PATTERN, FieldError
from . import images as repo
from . import inventory


async def known_shapes(conn: asyncpg.Connection) -> dict[str, ShapeInfo]:
    return usable_shapes(await inventory.shapes(conn))


async def resolve_shape(conn: asyncpg.Connection, name: str) -> ShapeInfo:
    """The shape a request names; a 422 on ``shape`` naming the known shapes when it is unknown or deleted."""
    known = await known_shapes(conn)
    if name not in known:
        names = ", ".join(sorted(known)) or "none"
        raise validation_problem([FieldError(field="shape", message=f"unknown shape; known shapes: {names}",
                                             code="unknown_shape")], f"unknown shape {name!r}; known shapes: {names}")
    return known[name]


def image_ref(row: asyncpg.Record) -> ImageRef:
    """The snapshot of a catalog row an allocation boots."""
    return ImageRef(image_id=row["id"], **{k: row[k] for k in ("name", "os", "format", "source", "sha256", "min_disk_gb",
                                                               "kernel", "initrd", "kernel_args")})


def seen_as(p: Principal) -> uuid.UUID | None:
    """The tenant whose view of the catalog the caller has; None: all of it (a provider admin)."""
    return None if p.is_provider_admin else p.tenant_id


async def visible_image(conn: asyncpg.Connection, p: Principal, *, image_id: uuid.UUID | None = None,
                   name: str | None = None) -> asyncpg.Record | None:
    row = await repo.find(conn, image_id=image_id, name=name)
    if row is None or not may_see_image(row["tenant_id"], row["visibility"], caller_tenant=p.tenant_id,
                                        provider_admin=p.is_provider_admin):
        return None
    return row


async def resolve_image(conn: asyncpg.Connection, p: Principal, ref: str | None) -> asyncpg.Record | None:
    """The image an allocation request names (its name or id), or the catalog's default when it names none
    (None: no default). A 422 on ``image`` naming it when the caller may not see it."""
    if ref is None:
        return await repo.default(conn)
    row = await visible_image(conn, p, image_id=uuid.UUID(ref) if re.fullmatch(UUID_PATTERN, ref) else None, name=ref)
    if row is None:
        shown = printable(ref, 63)
        raise validation_problem([FieldError(field="image", message=f"no image {shown!r} (GET /v1/images lists them)",
                                             code="unknown_image")], f"unknown image {shown!r}")
    return row
