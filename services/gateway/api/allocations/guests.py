"""The guest an allocation request asks for: the image it boots (snapshotted from the catalog) and the
first-boot data the node's cloud-init seed carries (hostname, SSH keys)."""
from __future__ import annotations

import uuid

import asyncpg

from services.node_agent.contracts import Guest

from ...adapters import ssh_keys
from ...adapters.catalog import image_ref, resolve_image
from ...domain.guest import MAX_GUEST_KEYS, guest_keys, hostname_for
from ...domain.model import Principal
from ...http.problems import printable, validation_problem
from ...http.schema_base import FieldError
from .schemas import AllocationCreate

UNRESOLVED = object()   # guest_for's image when the caller has not resolved it


async def _named_keys(conn: asyncpg.Connection, p: Principal, names: list[str] | None) -> list[str] | None:
    """The public keys of the caller's stored keys ``names`` names, in that order; a 422 naming each unknown one."""
    if names is None:
        return None
    found = {r["name"]: r["public_key"] for r in await ssh_keys.keys_of(conn, p.user_id, names)}
    unknown = [FieldError(field=f"key_names.{i}", message=f"you have no key named {printable(n, 63)!r}",
                          code="unknown_key") for i, n in enumerate(names) if n not in found]
    if unknown:
        raise validation_problem(unknown, "unknown key name(s): " + ", ".join(
            repr(printable(n, 63)) for n in names if n not in found))
    return [found[n] for n in names]


async def guest_for(conn: asyncpg.Connection, p: Principal, body: AllocationCreate, allocation_id: uuid.UUID, *,
                    image: asyncpg.Record | None | object = UNRESOLVED) -> Guest | None:
    """The Guest to send with allocation.request: None when the request names no image and the catalog has no
    default (the keys are still checked). Raises a 422 for an image the caller may not see, an unknown key
    name, or more keys than a guest takes. ``image``: the catalog row the request's image already resolved to
    (None: no image), when the caller has it; resolved here otherwise."""
    if image is UNRESOLVED:
        image = await resolve_image(conn, p, body.image)
    named = await _named_keys(conn, p, body.key_names)
    stored = []
    if body.ssh_keys is None and body.key_names is None:
        stored = [r["public_key"] for r in await ssh_keys.keys_of(conn, p.user_id)]
    keys = guest_keys(body.ssh_keys, named, stored)
    if len(keys) > MAX_GUEST_KEYS:
        raise validation_problem([FieldError(field="ssh_keys", code="too_many_keys",
                                             message=f"ssh_keys and key_names add up to {len(keys)} keys; a guest "
                                                     f"takes at most {MAX_GUEST_KEYS}")])
    if image is None:
        return None
    return Guest(image=image_ref(image), hostname=hostname_for(body.name, allocation_id), ssh_keys=keys)
