"""HTTP models of wipe-on-release: the evidence of an allocation's slot wipes, and a provider admin's re-wipe."""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from ...http.schema_base import Out

WipeStatus = Literal["not_released", "wiping", "wiped", "quarantined"]


class DeviceWipe(Out):
    """One device of the slot: how it was erased and how that was checked."""

    device: str
    method: str = Field(description="nvme-format-crypto, nvme-format-user-data, blkdiscard+wipefs, simulated "
                                    "(a host without the device: nothing was erased) or none.")
    bytes: int
    duration_s: float
    verified: bool
    verification: str
    ok: bool
    reason: str | None = None
    commands: list[str] = Field(default_factory=list, description="The commands the node-agent ran.")


class SlotWipe(Out):
    """The evidence of one slot's wipe: what was erased, how, how long, and how it was checked."""

    slot: int
    ok: bool = Field(description="The wipe passed; false: it failed and the slot was quarantined.")
    reason: str | None = Field(default=None, description="Why it failed (the quarantine's reason).")
    policy: str
    devices: list[DeviceWipe] = Field(default_factory=list)
    gpu_reset: str
    started_at: datetime
    finished_at: datetime
    duration_s: float
    agent_version: str
    source: Literal["release", "rewipe"] = Field(description="release: the release's own wipe; rewipe: a provider "
                                                              "admin's later re-wipe of the quarantined slot.")
    rewipe_request_id: uuid.UUID | None = None

    @classmethod
    def shown(cls, row: dict[str, Any]) -> SlotWipe:
        """From a slot_wipes row (its evidence: node_agent's SlotWipe as JSON; members added since are left out)."""
        evidence = row["evidence"]
        devices = [{k: d[k] for k in DeviceWipe.model_fields if k in d} for d in evidence.get("devices") or []]
        fields = {k: evidence[k] for k in cls.model_fields if k in evidence and k not in ("ok", "reason", "devices")}
        return cls(**fields, ok=row["ok"], reason=row["reason"], devices=devices,
                   source="rewipe" if row["request_id"] else "release", rewipe_request_id=row["request_id"])


class AllocationWipe(Out):
    """How the allocation's slots were wiped at its release. `not_released`: it is not releasing or released;
    `wiping`: it is, and no evidence came yet; `wiped`: every slot's wipe passed; `quarantined`: some slot's wipe
    failed (its entry says why) and the slot is out of service until a re-wipe passes (then it shows that)."""

    allocation_id: uuid.UUID
    status: WipeStatus
    node_id: uuid.UUID | None = None
    slots: list[SlotWipe] = Field(default_factory=list, description="The latest evidence of each slot, by slot.")
    wiped_at: datetime | None = Field(default=None, description="When the gateway recorded the release's wipe.")


class RewipeAccepted(Out):
    """A re-wipe sent to the node: the slot leaves `quarantined` in the node's document once it passes."""

    request_id: uuid.UUID
    node_id: uuid.UUID
    slot: int
    requested_by: uuid.UUID
