"""Wire models of the node-agent's hardware lifecycle: a node's BMC (bare metal through Redfish),
the wipe of released slots with its evidence, quarantine and re-wipe, and the burn-in before hand-off.
Part of the node-agent's contract (``services.node_agent.contracts`` declares the messages and re-exports these)."""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import Literal

from pydantic import Field

from services.scheduler.contracts import SlotDetail
from shared.wire import StepCommand, StepReply, Wire

WipeMethod = Literal["nvme-format-crypto", "nvme-format-user-data", "blkdiscard+wipefs", "simulated", "none"]


class Bmc(Wire):
    """A node's baseboard management controller as the gateway hands it to the node's agent. The password is
    sealed (AES-GCM, ``shared.secrets``) with the platform's secret key: it never crosses the bus in clear."""

    url: str = Field(max_length=1024, pattern=r"^https?://[^\s]+$", description="The BMC's Redfish service root URL.",
                     examples=["https://bmc-17.example"])
    system_id: str = Field(max_length=512, description="The Redfish system, e.g. /redfish/v1/Systems/<id>.")
    username: str = Field(max_length=255)
    password_sealed: str = Field(max_length=4096, description="The password, sealed with the platform's key.")
    verify_tls: bool = True
    ca_bundle: str | None = Field(default=None, max_length=65536, description="PEM CA bundle to verify the BMC with.")


class SetBmc(Wire):
    """Register (bmc) or remove (bmc null) the node's BMC. Idempotent: the highest version wins."""

    node_id: uuid.UUID
    bmc: Bmc | None
    version: int = Field(ge=1)
    set_by: uuid.UUID


class ValidateBmc(Wire):
    node_id: uuid.UUID
    bmc: Bmc


class BmcReport(Wire):
    """What the BMC answered: reachable, credentials accepted, and the system it describes."""

    ok: bool
    error_kind: Literal["unreachable", "unauthorized", "not_found", "refused", "timeout", "no_driver"] | None = None
    error: str | None = Field(default=None, max_length=2000)
    power_state: str | None = None
    model: str | None = None
    manufacturer: str | None = None
    serial: str | None = None
    elapsed_s: float = 0.0


class DeviceWipe(Wire):
    device: str
    method: WipeMethod
    bytes: int = Field(ge=0)
    duration_s: float = Field(ge=0)
    verified: bool
    verification: str = Field(max_length=2000)
    ok: bool
    reason: str | None = Field(default=None, max_length=2000)
    commands: list[str] = Field(default_factory=list)


class SlotWipe(Wire):
    """The evidence of one slot's wipe: what was erased, how, how long, and how it was checked."""

    slot: int = Field(ge=0)
    ok: bool
    reason: str | None = Field(default=None, max_length=2000)
    policy: str
    devices: list[DeviceWipe] = Field(default_factory=list)
    gpu_reset: str = Field(max_length=500)
    started_at: datetime
    finished_at: datetime
    duration_s: float = Field(ge=0)
    agent_version: str


class WipeSlots(StepCommand):
    """Release step: erase the slots' disks (and reset their GPUs) and record the evidence."""

    node_id: uuid.UUID
    slots: list[int] = Field(default_factory=list)
    slot_details: list[SlotDetail] = Field(default_factory=list)


class QuarantinedSlot(Wire):
    slot: int = Field(ge=0)
    reason: str = Field(max_length=2000)


class SlotsWiped(StepReply):
    """The wipe ran: evidence per slot. Slots whose wipe failed are listed in ``quarantine`` (the release goes
    on; the scheduler keeps those slots out of service)."""

    node_id: uuid.UUID
    evidence: list[SlotWipe] = Field(default_factory=list)
    quarantine: list[QuarantinedSlot] = Field(default_factory=list)


class Rewipe(Wire):
    """A provider admin asks the node to wipe a quarantined slot again."""

    request_id: uuid.UUID
    node_id: uuid.UUID
    slot: int = Field(ge=0)
    slot_detail: SlotDetail | None = None
    requested_by: uuid.UUID


class SlotRewiped(Wire):
    request_id: uuid.UUID
    node_id: uuid.UUID
    slot: int = Field(ge=0)
    ok: bool
    evidence: SlotWipe
    requested_by: uuid.UUID


class RunBurnIn(Wire):
    """Burn in the node before it becomes schedulable (the scheduler sends it on approval and on a re-run)."""

    node_id: uuid.UUID
    run_id: uuid.UUID
    requested_by: uuid.UUID | None = None


class BurnInCheck(Wire):
    name: str = Field(max_length=63)
    ok: bool
    detail: str = Field(default="", max_length=2000)


class BurnInFinished(Wire):
    node_id: uuid.UUID
    run_id: uuid.UUID
    passed: bool
    checks: list[BurnInCheck] = Field(default_factory=list)
    duration_s: float = Field(default=0.0, ge=0)
    at: datetime
