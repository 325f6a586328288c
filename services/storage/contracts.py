"""Wire contract of the storage service (tenant volumes)."""
from __future__ import annotations

import uuid

from pydantic import Field

from shared.contract import Message, ServiceContract
from shared.wire import StepCommand, StepFailure, StepReply, StepUndone, UndoCommand


class ProvisionVolume(StepCommand):
    size_gb: int = Field(ge=0, le=100_000)


class VolumeProvisioned(StepReply):
    volume_id: uuid.UUID | None
    size_gb: int


class VolumeProvisionFailed(StepFailure):
    pass


class DeleteVolume(UndoCommand):
    pass


class VolumeDeleted(StepUndone):
    pass


CONTRACT = ServiceContract(
    service="storage",
    title="Tessera storage service",
    description="Owns tenant volumes and their quotas.",
    messages=[
        Message("storage.provision_volume", "storage.cmd.provision_volume", ProvisionVolume, "command", "Saga step: provision the allocation's volume."),
        Message("storage.delete_volume", "storage.cmd.delete_volume", DeleteVolume, "command", "Saga step or compensation: delete the allocation's volume (idempotent)."),
        Message("storage.volume_provisioned", "storage.evt.volume_provisioned", VolumeProvisioned, "event", "The volume exists (volume_id is null when none was asked for)."),
        Message("storage.volume_provision_failed", "storage.evt.volume_provision_failed", VolumeProvisionFailed, "event", "The volume could not be provisioned."),
        Message("storage.volume_deleted", "storage.evt.volume_deleted", VolumeDeleted, "event", "The allocation has no volume."),
    ],
    receives=["storage.provision_volume", "storage.delete_volume"],
)
