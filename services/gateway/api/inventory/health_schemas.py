"""HTTP models of node health (provider admins): a node's health document and history, the fleet's states, the
policy that classifies alerts, the pools' automatic-cordon breakers, a node's drain, and the faults injected into
simulated nodes."""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import ClassVar, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from services.node_agent.contracts import FaultKind
from services.scheduler.contracts.health import CONDITION, Classification, HealthState

from ...http.schema_base import Body, Instant, Out, integer, text

ConditionName = text(64, min_length=1, pattern=CONDITION)
Note = text(500, multiline=True)
Reason = text(2000, multiline=True)

# the kinds of fault that strike one GPU (``gpu``), and those that take a ``value``
GPU_FAULTS = ("xid", "ecc_dbe", "retired_pages", "temperature", "power", "nvlink")
VALUED_FAULTS = ("temperature", "power", "slow_agent")


class HealthAlertOut(Out):
    """One current condition of the node, with the classifications the provider's policy gives it."""

    source: str = Field(description="Who saw it: nvml, sim, agent, burn_in, monitor.")
    target: str = Field(description="What it is about: node, gpu:<index>, nic:<name>.")
    condition: str = Field(examples=["xid:79"])
    since: datetime
    message: str
    tenant_message: str
    classifications: list[Classification] = Field(default_factory=list)


class HealthHistoryEntry(Out):
    """One change of the node's health, as the scheduler's health monitor described it."""

    version: int
    state: HealthState
    event: str = Field(description="What changed, in words.")
    alerts: int = Field(description="How many alerts the node had after it.")
    at: datetime


class NodeHealth(Out):
    """A node's health as the scheduler's health monitor last published it; ``unknown`` (version 0) when it never
    did."""

    node_id: uuid.UUID
    name: str | None = None
    pool: str | None = None
    state: HealthState
    since: datetime | None = Field(default=None, description="When the node entered this state (null: unknown).")
    last_seen: datetime | None = Field(default=None, description="The last heartbeat (null: never).")
    alerts: list[HealthAlertOut] = Field(default_factory=list)
    cordoned_by: str | None = Field(default=None, description="The condition whose classification cordoned the "
                                                              "node (null: health did not cordon it).")
    draining: bool = False
    drain_deadline: datetime | None = None
    breaker_open: bool = Field(default=False, description="Its pool's automatic-cordon breaker is open: health "
                                                          "cordons nothing there until a provider admin closes it.")
    version: int = Field(description="The health document's version (0: none yet).")
    history: list[HealthHistoryEntry] = Field(default_factory=list, description="The last 100 changes, newest "
                                                                                 "first.")


class FleetNode(Out):
    """One node's health at a glance."""

    node_id: uuid.UUID
    name: str
    pool: str | None = None
    state: HealthState
    since: datetime | None = None
    alerts: int = Field(description="How many alerts it has.")
    cordoned_by: str | None = None
    draining: bool = False
    breaker_open: bool = False


class FleetHealth(Out):
    """Every node's health state, by name."""

    items: list[FleetNode]


class HealthPolicyEntry(Out):
    """How one condition is classified (an empty list: it only alerts)."""

    condition: str = Field(examples=["xid:79"])
    classifications: list[Classification]
    note: str = ""
    requested_by: uuid.UUID | None = None
    version: int
    changed_at: datetime


class HealthPolicy(Out):
    """Every condition's classifications, by condition (``xid:default``: an XID without a row of its own)."""

    items: list[HealthPolicyEntry]


class HealthPolicySet(Body):
    """The classifications of one condition, replacing its current ones (an empty list: the condition only
    alerts). A classification named twice counts once."""

    server_owned: ClassVar[frozenset[str]] = frozenset({"condition", "version", "requested_by", "changed_at"})
    classifications: list[Classification] = Field(max_length=5, description="prevent_allocations, drain, fence, "
                                                                            "reset_gpu, replace.")
    note: Note = Field(default="", description="Why, for the other provider admins.")

    @field_validator("classifications")
    @classmethod
    def _once_each(cls, value: list[str]) -> list[str]:
        return list(dict.fromkeys(value))


class HealthPolicyAccepted(Out):
    """The policy change sent to the scheduler: GET /v1/health/policy shows it once applied (a new version)."""

    condition: str
    classifications: list[Classification]
    note: str
    requested_by: uuid.UUID


class Breaker(Out):
    """A pool's automatic-cordon breaker: it opens when health cordons too large a share of the pool within the
    window, and then health cordons nothing more there until a provider admin closes it."""

    pool: str
    open: bool
    opened_at: datetime | None = None
    cordons_in_window: int
    share: float = Field(description="The share of the pool's nodes that opens it.")
    window_s: float
    version: int


class Breakers(Out):
    items: list[Breaker]


class BreakerCloseAccepted(Out):
    pool: str
    requested_by: uuid.UUID


_DRAIN_RULES = {"allOf": [
    {"if": {"properties": {"mode": {"const": "deadline"}}, "required": ["mode"]},
     "then": {"required": ["deadline"], "properties": {"deadline": {"type": "string"}}},
     "else": {"properties": {"deadline": {"type": "null"}}}},
]}


class DrainRequest(Body):
    """Drain a node: cordon it, then move every allocation on it elsewhere, now or at ``deadline`` (``mode``
    deadline, and only then; allocations that end before it are left to end)."""

    server_owned: ClassVar[frozenset[str]] = frozenset({"node_id", "requested_by"})
    model_config = ConfigDict(json_schema_extra=_DRAIN_RULES)
    mode: Literal["now", "deadline"] = "now"
    deadline: Instant | None = Field(default=None, strict=False, description="RFC 3339 with an offset; with mode "
                                                                             "deadline only.")
    reason: Reason = Field(default="drained by a provider admin", description="Told to the tenants it moves.")

    @model_validator(mode="after")
    def _deadline_with_its_mode(self) -> DrainRequest:
        if (self.mode == "deadline") != (self.deadline is not None):
            raise ValueError("deadline: given with mode 'deadline', and only then")
        return self


class DrainAccepted(Out):
    node_id: uuid.UUID
    mode: Literal["now", "deadline"]
    deadline: datetime | None = None
    reason: str
    requested_by: uuid.UUID


# code is the XID of an xid fault: required there, refused elsewhere
_FAULT_RULES = {"allOf": [
    {"if": {"properties": {"kind": {"const": "xid"}}, "required": ["kind"]},
     "then": {"required": ["code"], "properties": {"code": {"type": "integer"}}},
     "else": {"properties": {"code": {"type": "null"}}}},
]}


class FaultRequest(Body):
    """A fault to inject into a simulated node. ``code``: the XID of kind xid (required there, refused for other
    kinds). ``gpu``: the GPU a GPU's fault strikes (xid, ecc_dbe, retired_pages, temperature, power, nvlink;
    default 0); ``value``: temperature (°C), power (W) or slow_agent (delay, s); ``duration_s``: how long a
    heartbeat_loss lasts (none: until cleared). A kind ignores the members it does not use. ``clear`` ends every
    injected fault."""

    server_owned: ClassVar[frozenset[str]] = frozenset({"request_id", "node_id", "accepted", "reason"})
    model_config = ConfigDict(json_schema_extra=_FAULT_RULES)
    kind: FaultKind
    gpu: integer(0, 63) | None = Field(default=None, description=f"For {', '.join(GPU_FAULTS)} (default 0).")
    code: integer(1, 1000) | None = Field(default=None, description="The XID, for kind xid (and only then).")
    value: float | None = Field(default=None, ge=-273, le=100_000,
                                description=f"For {', '.join(VALUED_FAULTS)}: °C, W or seconds.")
    duration_s: float | None = Field(default=None, gt=0, le=86400,
                                     description="For heartbeat_loss: how long (none: until cleared).")

    @model_validator(mode="after")
    def _code_of_an_xid(self) -> FaultRequest:
        if (self.kind == "xid") != (self.code is not None):
            raise ValueError("code: the XID is given with kind 'xid', and only then")
        return self


class Fault(Out):
    """A fault injected into a node, and the node's answer: ``accepted`` null until it answers; false with the
    ``reason`` when it refused (a node whose driver does not simulate hardware refuses every fault)."""

    request_id: uuid.UUID
    node_id: uuid.UUID
    kind: str
    gpu: int | None = None
    code: int | None = None
    value: float | None = None
    duration_s: float | None = None
    requested_by: uuid.UUID | None = None
    requested_at: datetime
    accepted: bool | None = None
    reason: str | None = None
    answered_at: datetime | None = None
