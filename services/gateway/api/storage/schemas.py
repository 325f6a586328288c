"""HTTP models of tenant volumes: a volume and its attachments, the storage classes offered, storage quotas.

A volume's name is its mount point's last component (``/mnt/<name>``), checked with the storage service's own
pattern (services.storage.contracts: lower-case letters, digits and '-', no path separator, no dot-names); its
size is in bytes, from 1 MiB to what its class allows (GET /v1/storage-classes).
"""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import ClassVar, Literal

from pydantic import Field

from services.storage.contracts import MAX_VOLUME_BYTES, MIN_VOLUME_BYTES, VOLUME_NAME_PATTERN

from ...http.schema_base import Body, Int, Out, Uuid, integer, text
from ...http.schema_types import Mode, StorageClassName

VolumeName = text(63, min_length=1, pattern=VOLUME_NAME_PATTERN)
MAX_QUOTA_BYTES = 1 << 62
MAX_QUOTA_VOLUMES = 1_000_000
_OWNED = frozenset({"id", "tenant_id", "user_id", "backend", "used_bytes", "requested_size_bytes", "scratch", "state",
                    "reason", "attachments", "mount_point", "version", "created_at", "updated_at", "links"})


# --- requests ---------------------------------------------------------------------------------------

class VolumeCreate(Body):
    server_owned: ClassVar[frozenset[str]] = _OWNED
    name: VolumeName = Field(description="Unique among the tenant's live volumes; the volume is mounted at "
                                         "/mnt/<name>.")
    storage_class: StorageClassName | None = Field(default=None, description="A class GET /v1/storage-classes lists "
                                                                             "(an unknown one is a 422); none: the "
                                                                             "default class.")
    size_bytes: Int = Field(ge=MIN_VOLUME_BYTES, le=MAX_VOLUME_BYTES,
                            description="At least 1 MiB, at most the class's max_volume_bytes (a 422 above it).")
    shared: bool = Field(default=False, description="Read-many: several allocations may attach it at once.")


class VolumeResize(Body):
    server_owned: ClassVar[frozenset[str]] = _OWNED
    # every volume holds at least MIN_VOLUME_BYTES, so a new size must be above it: what the schema can state of
    # "volumes only grow" (the handler compares it with the current size)
    size_bytes: Int = Field(gt=MIN_VOLUME_BYTES, le=MAX_VOLUME_BYTES,
                            description="The new size: above 1 MiB and larger than the current one (volumes only "
                                        "grow; a 422 otherwise), at most the class's max_volume_bytes.")


class AttachmentCreate(Body):
    server_owned: ClassVar[frozenset[str]] = frozenset({"state", "node_id", "reason"})
    allocation_id: Uuid = Field(description="An ACTIVE allocation of the tenant.")
    mode: Mode = Field(default="rw", description="rw, or ro (the slots cannot write).")


class StorageQuotaSet(Body):
    server_owned: ClassVar[frozenset[str]] = frozenset(
        {"tenant_id", "storage_class", "user_id", "provisioned_bytes", "volumes", "used_bytes", "version", "users"})
    max_bytes: integer(0, MAX_QUOTA_BYTES) | None = Field(default=None, description="Bytes the volumes of the class "
                                                                                     "may hold in all; null: the default "
                                                                                     "(a tenant) or the tenant's (a user).")
    max_volumes: integer(0, MAX_QUOTA_VOLUMES) | None = Field(default=None, description="How many volumes of the "
                                                                                        "class; null as for max_bytes.")


# --- responses --------------------------------------------------------------------------------------

class VolumeAttachmentOut(Out):
    """An allocation the volume is attached to (attaching until its node mounted it)."""

    allocation_id: uuid.UUID
    mode: Mode
    node_id: uuid.UUID | None = None
    state: Literal["attaching", "attached", "detaching", "failed"]
    reason: str | None = None


class VolumeOut(Out):
    """A tenant volume: creating, available, in-use, deleting, rejected or error (with the reason)."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    user_id: uuid.UUID | None = Field(description="Who created it.")
    name: str
    storage_class: str
    backend: str | None = Field(description="btrfs, lustre, vast or weka.")
    size_bytes: int
    requested_size_bytes: int | None = Field(description="A resize asked for and not yet applied (null: none).")
    used_bytes: int | None = Field(description="What the storage system counts (null: not reported yet).")
    shared: bool
    scratch: bool = Field(description="The scratch volume of one allocation, destroyed with it.")
    state: Literal["creating", "available", "in-use", "deleting", "deleted", "rejected", "error"]
    reason: str | None = Field(description="Why the last request about it was refused.")
    attachments: list[VolumeAttachmentOut]
    mount_point: str = Field(description="/mnt/<name>, in every slot of an allocation it is attached to.")
    created_at: datetime
    updated_at: datetime
    links: dict[str, str]


class VolumePage(Out):
    """One page of the tenant's volumes (deleted ones left out), newest first."""

    items: list[VolumeOut]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next (older) page; null on the last page.")


class StorageClassOut(Out):
    """A storage class the provider offers."""

    name: str
    backend: str
    description: str
    max_volume_bytes: int
    default: bool = Field(description="The class of a volume (or a scratch volume) that names none.")
    simulated: bool = Field(description="The backend's calls are rendered and recorded; no appliance is reached.")


class StorageClassList(Out):
    """The storage classes offered, and the quota a tenant has in each when none is set for it."""

    items: list[StorageClassOut]
    default_quota_bytes: int | None = Field(description="null: no class was announced yet.")
    default_quota_volumes: int | None


class StorageQuotaSetOut(Out):
    """The requested quota (the storage service applies it; GET shows it once applied)."""

    tenant_id: uuid.UUID
    storage_class: str
    user_id: uuid.UUID | None = None
    max_bytes: int | None
    max_volumes: int | None


class StorageShareOut(Out):
    """A user's share of the tenant's quota in one class, and what the user's volumes hold."""

    user_id: uuid.UUID
    max_bytes: int | None = Field(description="null: no own limit (the tenant's applies).")
    max_volumes: int | None
    provisioned_bytes: int
    volumes: int
    version: int


class StorageQuotaOut(Out):
    """A tenant's quota in one storage class, what its live volumes hold, and its users' shares."""

    tenant_id: uuid.UUID
    storage_class: str
    max_bytes: int | None = Field(description="The limit that applies: the provider's, else the default (null: none "
                                              "known yet).")
    max_volumes: int | None
    quota_set: bool = Field(description="false: no quota of its own is set; the limits are the defaults.")
    provisioned_bytes: int = Field(description="The sizes of the live volumes, scratch volumes and pending resizes "
                                               "included: what the quota is charged.")
    volumes: int
    used_bytes: int = Field(description="What the storage systems report the volumes use.")
    version: int | None = None
    users: list[StorageShareOut] = Field(default_factory=list)


class StorageQuotaList(Out):
    """The tenant's storage quotas, by class."""

    items: list[StorageQuotaOut]
