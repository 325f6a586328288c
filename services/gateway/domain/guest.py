"""What an allocation's guest is told at first boot: its hostname and keys, and who may boot which image (pure)."""
from __future__ import annotations

import re
import uuid

MAX_GUEST_KEYS = 32         # services.node_agent.contracts.Guest.ssh_keys holds at most this many


def hostname_for(name: str, allocation_id: uuid.UUID) -> str:
    """A valid hostname (RFC 1123 label: lower case, [a-z0-9-], 1 to 63, no '-' at either end) from an
    allocation's name; ``vm-<first 8 hex digits of the id>`` when nothing of the name is left."""
    label = re.sub(r"[^a-z0-9-]+", "-", name.lower())
    label = re.sub(r"-{2,}", "-", label).strip("-")[:63].rstrip("-")
    return label or f"vm-{allocation_id.hex[:8]}"


def may_see_image(image_tenant: uuid.UUID | None, visibility: str, *, caller_tenant: uuid.UUID | None,
                  provider_admin: bool) -> bool:
    """Provider admins see every image; a tenant's members see the public ones and their tenant's private ones."""
    return provider_admin or visibility == "public" or (caller_tenant is not None and image_tenant == caller_tenant)


def guest_keys(given: list[str] | None, named: list[str] | None, stored: list[str]) -> list[str]:
    """The keys a guest gets: the keys given (``ssh_keys``) and those of the stored keys the request names
    (``key_names``), in that order, each once; all the caller's ``stored`` keys when neither list was sent."""
    if given is None and named is None:
        return list(dict.fromkeys(stored))
    return list(dict.fromkeys([*(given or []), *(named or [])]))
