"""HTTP models of what runs for an allocation: its instance, and the power actions asked of it."""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import Literal

from pydantic import Field

from ...http.schema_base import Out

PowerAction = Literal["reboot", "stop", "start"]
PowerState = Literal["running", "stopped", "unknown"]


class Phase(Out):
    """One provisioning phase of a bare-metal instance and how long it took."""

    name: str
    seconds: float


class MountOut(Out):
    """A volume mounted into the instance: where its slots see it and how."""

    volume_id: uuid.UUID
    name: str
    mount_point: str = Field(description="/mnt/<volume name>")
    mode: Literal["rw", "ro"]
    via: str = Field(description="virtiofs (VM), bind (a slot's own mount namespace), or the backend's client "
                                 "(nfs, lustre).")
    tag: str | None = Field(default=None, description="virtiofs: the device's mount tag.")
    simulated: bool = Field(default=False, description="True: the backend's client mount was rendered, not run.")


class InstanceOut(Out):
    """The instance the node made for the allocation, as allocation.activated described it; power_state follows
    the power actions. On a host without GPUs the libvirt driver boots the guest without passthrough and says
    so: passthrough `simulated`."""

    @classmethod
    def shown(cls, stored: dict) -> "InstanceOut":
        """From the stored InstanceInfo (node_agent.contracts): what this API shows of it (a field the wire
        model gained since is left out, not an error)."""
        shown = {k: v for k, v in stored.items() if k in cls.model_fields}
        shown["phases"] = [{k: p[k] for k in Phase.model_fields if k in p} for p in stored.get("phases") or []]
        shown["mounts"] = [{k: m[k] for k in MountOut.model_fields if k in m} for m in stored.get("mounts") or []]
        return cls(**shown)

    instance_id: str = Field(description="The driver's name for it (libvirt: the domain name).")
    driver: str = Field(description="The driver that made it: sim, libvirt, ...")
    dataplane: str = Field(description="none (no network plumbed) or kernel.")
    node_id: uuid.UUID
    image: str | None = None
    hostname: str | None = None
    passthrough: Literal["real", "simulated", "none"] = Field(
        description="real: the GPUs, NVMe and InfiniBand VF were passed through; simulated: the host lacks them "
                    "(no GPUs), the guest runs without; none: the driver has no devices.")
    booted_at: datetime | None = None
    prepare_s: float | None = Field(default=None, description="Seconds to verify the image and make the overlay and seed.")
    start_s: float | None = Field(default=None, description="Seconds the hypervisor took to define and start it.")
    boot_s: float | None = Field(default=None, description="Seconds from start to the guest's ready line.")
    power_state: PowerState = "running"
    phases: list[Phase] = Field(default_factory=list, description="Bare metal: each provisioning phase (power, "
                                "virtual media, boot, ...) and its duration, in order.")
    redfish_calls: int | None = Field(default=None, description="Bare metal: HTTP requests made to the node's BMC.")
    mounts: list[MountOut] = Field(default_factory=list, description="The volumes mounted into the instance, each "
                                                                     "at /mnt/<name>.")


class PowerActionLinks(Out):
    self: str
    allocation: str


class PowerActionOut(Out):
    """A power action asked of an allocation's instance: pending until the node answers, then succeeded or
    failed (with the reason). No answer by `expires_at` (plus a grace): failed, naming the node and the
    deadline; an answer the node sent in time that arrives after that still shows (its outcome wins, the
    reason says it came late)."""

    id: uuid.UUID
    allocation_id: uuid.UUID
    action: PowerAction
    state: Literal["pending", "succeeded", "failed"]
    reason: str | None = None
    power_state: PowerState | None = Field(default=None, description="The instance's power state after the action.")
    requested_by: uuid.UUID
    requested_at: datetime
    finished_at: datetime | None = None
    expires_at: datetime = Field(description="The deadline: the node refuses the action after it, without acting.")
    links: PowerActionLinks


class PowerActionPage(Out):
    """One page of the allocation's power actions, newest first."""

    items: list[PowerActionOut]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next (older) page; null on the last page.")
