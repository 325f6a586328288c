"""HTTP models of what runs for an allocation: its instance, and the power actions asked of it."""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import Literal

from pydantic import Field

from services.node_agent.contracts import InstanceInfo, Mount, PowerAction, PowerState
from services.node_agent.contracts import Phase as WirePhase

from ...http.schema_base import Out

# The API's models of an instance are the node-agent's wire models (one set of fields and descriptions) under
# the API's own component names.

class Phase(WirePhase):
    __doc__ = WirePhase.__doc__


class MountOut(Mount):
    __doc__ = Mount.__doc__


class InstanceOut(InstanceInfo):
    """The instance the node made for the allocation, as allocation.activated described it; power_state follows
    the power actions. On a host without GPUs the libvirt driver boots the guest without passthrough and says
    so: passthrough `simulated`."""

    phases: list[Phase] = InstanceInfo.model_fields["phases"]
    mounts: list[MountOut] = InstanceInfo.model_fields["mounts"]

    @classmethod
    def shown(cls, stored: dict) -> InstanceOut:
        """From the stored InstanceInfo (node_agent.contracts): what this API shows of it (a field the wire
        model gained since is left out, not an error)."""
        shown = {k: v for k, v in stored.items() if k in cls.model_fields}
        shown["phases"] = [{k: p[k] for k in Phase.model_fields if k in p} for p in stored.get("phases") or []]
        shown["mounts"] = [{k: m[k] for k in MountOut.model_fields if k in m} for m in stored.get("mounts") or []]
        return cls(**shown)


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
