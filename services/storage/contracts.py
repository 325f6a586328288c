"""Wire contract of the storage service: tenant volumes, their quotas per storage class, and their exports.

Volumes are tenant objects. The gateway sends the management commands (create, resize, destroy, attach,
detach, set quota); the service answers every change of a volume with ``storage.volume_changed``, carrying
the whole volume (its state, attachments and the reason of its last refused request) with a ``version`` that
only grows, so a read model keeps the highest. A refusal no retry can fix (over quota, unknown class, the
backend's own refusal) is published at once and visible on the volume (``reason``; a create refused is state
``rejected``).

The allocate saga's ``provision_volume`` step creates the allocation's scratch volume (``size_gb`` > 0) and
attaches the volumes the request names; its reply carries the exports the node-agent mounts (``volumes``).
Its undo (``delete_volume``: a compensation or the release step) detaches every volume of the allocation
and destroys its scratch volume only.

Every volume belongs to one storage class, which the provider configures (``TESSERA_STORAGE_CLASSES``) and
the service announces on start (``storage.classes_announced``); a class names its backend: ``btrfs``
(real), ``lustre``, ``vast`` or ``weka`` (the calls rendered and recorded).
"""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from shared.contract import Message, ServiceContract
from shared.steps import Step
from shared.wire import StepCommand, StepFailure, StepReply, StepUndone, UndoCommand, Wire

# a volume's name is its mount point's last component (/mnt/<name>): no path separator, no NUL, no dot-names
VOLUME_NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
CLASS_NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,31}$"
VolumeName = Annotated[str, StringConstraints(pattern=VOLUME_NAME_PATTERN)]
ClassName = Annotated[str, StringConstraints(pattern=CLASS_NAME_PATTERN)]
Mode = Literal["rw", "ro"]
MAX_VOLUME_BYTES = 1 << 50          # 1 PiB: no class offers more per volume
MIN_VOLUME_BYTES = 1 << 20          # 1 MiB
MAX_ATTACHED = 16                   # volumes one allocation may mount
GB = 10 ** 9                        # the saga's scratch size is in GB (today's volume_gb), as the API's quotas
VolumeState = Literal["creating", "available", "in-use", "deleting", "deleted", "rejected", "error"]
AttachmentState = Literal["attaching", "attached", "detaching", "failed"]


class VolumeRef(Wire):
    """A volume an allocation asks to mount (an existing volume of its tenant)."""

    volume_id: uuid.UUID
    mode: Mode = Field(default="rw", description="rw, or ro (the slot cannot write).")


class VolumeExport(Wire):
    """What a node mounts into the allocation's slots: the volume appears at ``/mnt/<name>``."""

    volume_id: uuid.UUID
    name: VolumeName
    mode: Mode
    backend: str = Field(max_length=32, description="btrfs, lustre, vast or weka.")
    source: str = Field(max_length=1024, description="btrfs: the subvolume's path on the storage host (virtiofs or "
                                                     "bind mount); lustre: 'mgs@net:/fsname'; vast, weka: 'host:/path'.")
    options: dict[str, str] = Field(default_factory=dict, description="Backend mount options (e.g. the fileset).")


# --- the saga step -------------------------------------------------------------------------------------------
class ProvisionVolume(StepCommand):
    size_gb: int = Field(default=0, ge=0, le=100_000, description="The scratch volume's size (0: none).")
    scratch_class: ClassName | None = Field(default=None, description="The scratch volume's class (none: the default).")
    volumes: list[VolumeRef] = Field(default_factory=list, max_length=MAX_ATTACHED,
                                     description="Existing volumes of the tenant to attach.")
    user_id: uuid.UUID | None = None
    node_id: uuid.UUID | None = None
    ip_address: str | None = Field(default=None, description="The slot's address: the client the export allows.")


class VolumeProvisioned(StepReply):
    volume_id: uuid.UUID | None = Field(description="The scratch volume (null when none was asked for).")
    size_gb: int
    exports: list[VolumeExport] = Field(default_factory=list, description="Every volume to mount, scratch included.")


class VolumeProvisionFailed(StepFailure):
    pass


class DeleteVolume(UndoCommand):
    pass


class VolumeDeleted(StepUndone):
    pass


PROVISION_VOLUME = Step.declare(
    "storage",
    command=("provision_volume", ProvisionVolume,
             "Saga step: create the allocation's scratch volume and attach the volumes it names."),
    ok=("volume_provisioned", VolumeProvisioned, "The volumes exist and are exported to the allocation."),
    failed=("volume_provision_failed", VolumeProvisionFailed, "The volumes could not be provisioned (reason)."),
    undo=("delete_volume", DeleteVolume,
          "Saga step or compensation: detach the allocation's volumes, destroy its scratch volume (idempotent)."),
    undone=("volume_deleted", VolumeDeleted, "The allocation has no volume attached and no scratch volume."),
)


# --- management commands (from the gateway) -----------------------------------------------------------------
class CreateVolume(Wire):
    volume_id: uuid.UUID = Field(description="Chosen by the requester; repeating the command is harmless.")
    tenant_id: uuid.UUID
    user_id: uuid.UUID
    name: VolumeName
    storage_class: ClassName
    size_bytes: int = Field(ge=MIN_VOLUME_BYTES, le=MAX_VOLUME_BYTES)
    shared: bool = Field(default=False, description="Read-many: several allocations may attach it.")


class ResizeVolume(Wire):
    volume_id: uuid.UUID
    tenant_id: uuid.UUID
    request_id: uuid.UUID
    size_bytes: int = Field(ge=MIN_VOLUME_BYTES, le=MAX_VOLUME_BYTES, description="The new size (grow only).")


class DestroyVolume(Wire):
    volume_id: uuid.UUID
    tenant_id: uuid.UUID


class AttachVolume(Wire):
    """Attach a volume to a running allocation (the node mounts it live)."""

    volume_id: uuid.UUID
    tenant_id: uuid.UUID
    allocation_id: uuid.UUID
    mode: Mode = "rw"
    node_id: uuid.UUID
    ip_address: str | None = None


class DetachVolume(Wire):
    volume_id: uuid.UUID
    tenant_id: uuid.UUID
    allocation_id: uuid.UUID


class SetStorageQuota(Wire):
    """A tenant's quota in one class (user_id null), or a user's share of it (a tenant admin's split)."""

    tenant_id: uuid.UUID
    storage_class: ClassName
    user_id: uuid.UUID | None = None
    max_bytes: int | None = Field(default=None, ge=0, le=1 << 62, description="null: the default (tenant) or no "
                                                                               "own limit (user: the tenant's).")
    max_volumes: int | None = Field(default=None, ge=0, le=1_000_000)
    set_by: uuid.UUID


# --- events -------------------------------------------------------------------------------------------------
class Attachment(Wire):
    allocation_id: uuid.UUID
    mode: Mode
    node_id: uuid.UUID | None = None
    state: AttachmentState
    reason: str | None = Field(default=None, max_length=2000)


class VolumeDoc(Wire):
    """A volume as the tenant sees it."""

    volume_id: uuid.UUID
    tenant_id: uuid.UUID
    user_id: uuid.UUID | None = None
    name: str = Field(max_length=63)
    storage_class: str = Field(max_length=32)
    backend: str = Field(max_length=32)
    size_bytes: int = Field(ge=0)
    used_bytes: int | None = Field(default=None, ge=0, description="As the storage system counts it (btrfs: the "
                                                                   "qgroup's referenced bytes).")
    shared: bool = False
    scratch: bool = Field(default=False, description="Made for one allocation and destroyed with it.")
    state: VolumeState
    reason: str | None = Field(default=None, max_length=2000, description="Why the last request was refused.")
    attachments: list[Attachment] = Field(default_factory=list)
    version: int = Field(ge=1)
    created_at: datetime
    updated_at: datetime


class VolumeChanged(Wire):
    volume: VolumeDoc


class QuotaChanged(Wire):
    tenant_id: uuid.UUID
    storage_class: str = Field(max_length=32)
    user_id: uuid.UUID | None = None
    max_bytes: int | None = None
    max_volumes: int | None = None
    effective_max_bytes: int = Field(description="The limit that applies (the default when none is set).")
    effective_max_volumes: int
    version: int = Field(ge=1)


class StorageClass(Wire):
    name: str = Field(max_length=32)
    backend: str = Field(max_length=32)
    description: str = Field(default="", max_length=500)
    max_volume_bytes: int
    default: bool = False
    simulated: bool = Field(description="True: the backend renders and records its calls; no appliance is reached.")


class ClassesAnnounced(Wire):
    classes: list[StorageClass]
    default_quota_bytes: int
    default_quota_volumes: int


class VolumeUsage(Wire):
    volume_id: uuid.UUID
    used_bytes: int = Field(ge=0)
    limit_bytes: int = Field(ge=0)


class UsageReported(Wire):
    """What the tenant's volumes use, read from the storage systems (periodically)."""

    tenant_id: uuid.UUID
    volumes: list[VolumeUsage]
    at: datetime


CONTRACT = ServiceContract(
    service="storage",
    title="Tessera storage service",
    description="Owns tenant volumes, their quotas per storage class, and their exports to allocations.",
    messages=[
        Message("storage.create_volume", "storage.cmd.create_volume", CreateVolume, "command",
                "Create a tenant volume in a storage class (within the tenant's and the user's quota)."),
        Message("storage.resize_volume", "storage.cmd.resize_volume", ResizeVolume, "command",
                "Grow a volume (within quota)."),
        Message("storage.destroy_volume", "storage.cmd.destroy_volume", DestroyVolume, "command",
                "Destroy a volume without attachments, and its data."),
        Message("storage.attach_volume", "storage.cmd.attach_volume", AttachVolume, "command",
                "Attach a volume to a running allocation (its node mounts it)."),
        Message("storage.detach_volume", "storage.cmd.detach_volume", DetachVolume, "command",
                "Detach a volume from an allocation (its node unmounts it)."),
        Message("storage.set_quota", "storage.cmd.set_quota", SetStorageQuota, "command",
                "Set a tenant's quota in a storage class, or a user's share of it."),
        Message("storage.volume_changed", "storage.evt.volume_changed", VolumeChanged, "event",
                "A volume changed (state, size, attachments, a refusal's reason): the whole volume, versioned."),
        Message("storage.quota_changed", "storage.evt.quota_changed", QuotaChanged, "event",
                "A storage quota was set."),
        Message("storage.classes_announced", "storage.evt.classes_announced", ClassesAnnounced, "event",
                "The storage classes the provider offers (on every start of the service)."),
        Message("storage.usage_reported", "storage.evt.usage_reported", UsageReported, "event",
                "What a tenant's volumes use, per volume, as their storage systems count it."),
    ],
    receives=["storage.create_volume", "storage.resize_volume", "storage.destroy_volume", "storage.attach_volume",
              "storage.detach_volume", "storage.set_quota", "node_agent.volume_mount_changed"],
    sends=["node_agent.mount_volume", "node_agent.unmount_volume"],
    steps=[PROVISION_VOLUME],
)
