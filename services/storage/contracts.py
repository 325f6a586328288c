"""Wire contract of the storage service (tenant volumes)."""
from __future__ import annotations

import uuid

from pydantic import Field

from shared.contract import ServiceContract
from shared.steps import Step
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


PROVISION_VOLUME = Step.declare(
    "storage",
    command=("provision_volume", ProvisionVolume, "Saga step: provision the allocation's volume."),
    ok=("volume_provisioned", VolumeProvisioned, "The volume exists (volume_id is null when none was asked for)."),
    failed=("volume_provision_failed", VolumeProvisionFailed, "The volume could not be provisioned."),
    undo=("delete_volume", DeleteVolume, "Saga step or compensation: delete the allocation's volume (idempotent)."),
    undone=("volume_deleted", VolumeDeleted, "The allocation has no volume."),
)


CONTRACT = ServiceContract(
    service="storage",
    title="Tessera storage service",
    description="Owns tenant volumes and their quotas.",
    messages=[],
    steps=[PROVISION_VOLUME],
)
