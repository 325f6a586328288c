"""The storage an allocation request asks for: existing volumes of the tenant to mount (``volumes``) and the class
of its scratch volume (``scratch_class``, ``volume_gb``), checked before anything is written or sent.

Each named volume must be a live volume of the tenant that can be mounted now: available, or in use and shared;
anything else (another tenant's volume included: "no such volume") is a 422 naming ``volumes.<i>.volume_id``.
The scratch volume is charged against the class's quota as a fast check only (the storage service creates it
in the saga and checks atomically then).
"""
from __future__ import annotations

import asyncpg

from services.storage.contracts import GB, VolumeRef

from ...adapters import volumes as repo
from ...adapters.admission import charge, class_problem
from ...domain.model import Principal
from ...domain.volumes import READY, Offer, StorageClass
from ...http.problems import validation_problem
from ...http.schema_base import FieldError
from .schemas import AllocationCreate


def _field(i: int) -> str:
    return f"volumes.{i}.volume_id"


def _duplicates(body: AllocationCreate) -> list[FieldError]:
    first: dict = {}
    errors = []
    for i, ref in enumerate(body.volumes):
        if ref.volume_id in first:
            errors.append(FieldError(field=_field(i), code="duplicate",
                                     message=f"the volume is named twice (also {_field(first[ref.volume_id])})"))
        first.setdefault(ref.volume_id, i)
    return errors


async def _unmountable(conn: asyncpg.Connection, p: Principal, row: asyncpg.Record | None) -> str | None:
    """Why the volume cannot be named by a new allocation (None: it can)."""
    if row is None or row["state"] == "rejected":
        return "no such volume"
    if row["scratch"]:
        return "a scratch volume belongs to its allocation"
    if row["state"] not in READY:
        return f"the volume is {row['state']}; an available (or shared in-use) volume can be mounted"
    if row["shared"]:
        return None
    held = [a for a in repo.attachments_of(row) if a.get("state") != "failed"]
    if row["state"] == "in-use" or held or await repo.live_allocations_naming(conn, p.tenant_id, row["id"]):
        return "the volume is not shared and is attached to (or requested by) another allocation"
    return None


async def volume_refs(conn: asyncpg.Connection, p: Principal, body: AllocationCreate) -> list[VolumeRef]:
    """The volumes to send with allocation.request; a 422 naming each one that cannot be mounted."""
    errors = _duplicates(body)
    if errors:
        raise validation_problem(errors)
    if not body.volumes:
        return []
    found = await repo.of_tenant(conn, p.tenant_id, [r.volume_id for r in body.volumes])
    for i, ref in enumerate(body.volumes):
        problem = await _unmountable(conn, p, found.get(ref.volume_id))
        if problem:
            errors.append(FieldError(field=_field(i), message=problem, code="volume"))
    if errors:
        raise validation_problem(errors)
    return [VolumeRef(volume_id=r.volume_id, mode=r.mode) for r in body.volumes]


async def scratch_class(conn: asyncpg.Connection, body: AllocationCreate) -> tuple[Offer | None, StorageClass | None]:
    """The class the scratch volume will be made in: the one named (a 422 when it is not offered), else the
    default (None when no class is known yet: the storage service decides). A request with neither a class nor a
    scratch volume has nothing to check or charge: (None, None), and the offer is not read."""
    if body.scratch_class is None and body.volume_gb == 0:
        return None, None
    offer = await repo.offer(conn)
    if body.scratch_class is None:
        return offer, offer.find(None)
    found = offer.find(body.scratch_class)
    if found is None:
        raise class_problem("scratch_class", body.scratch_class, offer)
    return offer, found


async def charge_scratch(conn: asyncpg.Connection, p: Principal, body: AllocationCreate, offer: Offer | None,
                         cls: StorageClass | None) -> None:
    """403 quota-exceeded when the class's quota (as the view counts it) cannot take the scratch volume."""
    if body.volume_gb > 0 and cls is not None and offer is not None:
        await charge(conn, p.tenant_id, p.user_id, cls.name, offer, requested_bytes=body.volume_gb * GB,
                     requested_volumes=1, lock=False)
