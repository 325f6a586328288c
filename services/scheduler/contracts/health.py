"""The scheduler's health messages: what the health monitor publishes about each node, the policy that classifies
alerts, the provider's drain, and the automatic-cordon breaker (services/scheduler/domain/health.py)."""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import Literal

from pydantic import Field, model_validator

from shared.wire import Wire

HealthState = Literal["unknown", "healthy", "suspect", "unreachable", "reconciling"]
Classification = Literal["prevent_allocations", "drain", "fence", "reset_gpu", "replace"]
CONDITION = r"^[a-z_]+(:([0-9]+|default))?$"


class HealthAlert(Wire):
    """One condition of a node, as the node-agent (or the monitor, for a lost heartbeat) reported it, with the
    classifications the provider's policy gives it."""
    source: str = Field(max_length=64, description="Who saw it: nvml, sim, agent, burn_in, monitor.")
    target: str = Field(max_length=64, description="What it is about: node, gpu:<index>, nic:<name>.")
    condition: str = Field(max_length=64, pattern=CONDITION, examples=["xid:79", "ecc_dbe", "heartbeat_lost"])
    since: datetime
    message: str = Field(max_length=2000, description="For the provider.")
    tenant_message: str = Field(max_length=2000, description="For a tenant whose allocation it touches.")
    classifications: list[Classification] = Field(default_factory=list)


class NodeHealthChanged(Wire):
    """A node's whole health document after any change (state, alerts, cordon by health, drain)."""
    node_id: uuid.UUID
    pool: str
    state: HealthState
    since: datetime = Field(description="When the node entered this state.")
    last_seen: datetime | None = Field(default=None, description="The last heartbeat received (none: never).")
    alerts: list[HealthAlert] = Field(default_factory=list)
    cordoned_by: str | None = Field(default=None, description="The condition whose classification cordoned the "
                                                              "node (none: health did not cordon it).")
    draining: bool = False
    drain_deadline: datetime | None = None
    breaker_open: bool = Field(default=False, description="The node's pool's automatic-cordon breaker is open: "
                                                          "health cordons nothing there until a provider admin "
                                                          "closes it.")
    event: str = Field(max_length=200, description="What changed, in words (kept in the node's health history).")
    version: int = Field(ge=1)


class SetHealthPolicy(Wire):
    """A provider admin sets the classifications of one condition (an empty list: the condition only alerts)."""
    condition: str = Field(max_length=64, pattern=CONDITION, examples=["xid:79", "xid:default", "temperature"])
    classifications: list[Classification] = Field(max_length=5)
    note: str = Field(default="", max_length=500)
    requested_by: uuid.UUID | None = None


class HealthPolicyChanged(SetHealthPolicy):
    version: int = Field(ge=1)


class DrainNode(Wire):
    """A provider admin drains a node: cordon it, then move every allocation on it elsewhere, now or at a
    deadline (allocations that end before it are left to end)."""
    node_id: uuid.UUID
    mode: Literal["deadline", "now"] = "now"
    deadline: datetime | None = None
    reason: str = Field(default="drained by a provider admin", max_length=2000)
    requested_by: uuid.UUID | None = None

    @model_validator(mode="after")
    def _deadline(self) -> DrainNode:
        if (self.mode == "deadline") != (self.deadline is not None):
            raise ValueError("a deadline is given with mode 'deadline', and only then")
        return self


class CloseBreaker(Wire):
    """A provider admin closes a pool's automatic-cordon breaker (health cordons there again)."""
    pool: str = Field(max_length=63)
    requested_by: uuid.UUID | None = None


class BreakerChanged(Wire):
    pool: str
    open: bool
    opened_at: datetime | None = None
    cordons_in_window: int = 0
    share: float
    window_s: float
    version: int = Field(ge=1)
