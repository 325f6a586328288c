"""The gateway's pure rules for tenant volumes (no I/O): which states count, what a storage class offers, the
limits that apply, and the storage quota fast check.

The check is the gateway's, made atomically against its own read model (the handler holds the quota rows'
locks while it counts); the storage service checks again, atomically against its own records, and stays the
judge: a create it refuses shows as state ``rejected`` with the reason.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass

from .scheduling import QuotaBreach

# the states in which a volume holds its space (and its name)
LIVE = ("creating", "available", "in-use", "deleting")
# the states in which a volume may be resized, attached, or named by an allocation request
READY = ("available", "in-use")
ENDED_ALLOCATION = ("RELEASED", "FAILED")


def mount_point(name: str) -> str:
    """Where every slot of an allocation sees the volume."""
    return f"/mnt/{name}"


def volume_links(volume_id: uuid.UUID) -> dict[str, str]:
    base = f"/v1/volumes/{volume_id}"
    return {"self": base, "attachments": f"{base}/attachments"}


@dataclass(frozen=True)
class StorageClass:
    name: str
    backend: str
    max_volume_bytes: int
    default: bool = False
    description: str = ""
    simulated: bool = False


@dataclass(frozen=True)
class Offer:
    """The classes last announced, and the quota a tenant has in each when none is set for it."""

    classes: tuple[StorageClass, ...]
    default_quota_bytes: int | None = None
    default_quota_volumes: int | None = None

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.classes]

    def find(self, name: str | None) -> StorageClass | None:
        """The class ``name`` names; None (the argument) is the default class, if one is flagged."""
        if name is None:
            return next((c for c in self.classes if c.default), None)
        return next((c for c in self.classes if c.name == name), None)


NO_OFFER = Offer(())


@dataclass(frozen=True)
class Limits:
    """What may be held in one class: None is no limit of this level (the tenant's still applies to a user)."""

    max_bytes: int | None = None
    max_volumes: int | None = None


@dataclass(frozen=True)
class Use:
    bytes: int = 0
    volumes: int = 0


def tenant_limits(max_bytes: int | None, max_volumes: int | None, offer: Offer) -> Limits:
    """The tenant's effective limits: the quota the provider set, else the announced defaults."""
    return Limits(max_bytes if max_bytes is not None else offer.default_quota_bytes,
                  max_volumes if max_volumes is not None else offer.default_quota_volumes)


def storage_breach(storage_class: str, tenant: tuple[Limits, Use], user: tuple[Limits, Use] | None, *,
                   requested_bytes: int, requested_volumes: int) -> QuotaBreach | None:
    """The first limit the request would exceed (tenant bytes, tenant volumes, then the user's), or None.

    A request that adds nothing of a kind (a resize adds no volume) is never refused on that kind, even when
    the use is already over a lowered limit."""
    levels = [("", tenant)] + ([(":user", user)] if user is not None else [])
    for level, (limits, use) in levels:
        checks = [("bytes", limits.max_bytes, use.bytes, requested_bytes),
                  ("volumes", limits.max_volumes, use.volumes, requested_volumes)]
        for kind, limit, used, requested in checks:
            if requested > 0 and limit is not None and used + requested > limit:
                return QuotaBreach(f"storage:{storage_class}{level}:{kind}", limit, used, requested)
    return None
