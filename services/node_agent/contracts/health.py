"""Wire contract of the node's health: the heartbeat its agent sends, the faults a provider may inject on a
simulated node, and the fencing of instances whose allocation moved to another node.

A heartbeat is published live (a plain core-NATS publish, never through the outbox, never stored in a stream):
it proves the agent is alive and connected now, which a copy replayed later must not seem to. Its ``alerts``
are the node's current ones; an alert leaves the list when its fault clears. The agent leaves an alert's
``classifications`` empty: the scheduler's policy fills them.
"""
from __future__ import annotations

from datetime import datetime
from typing import Literal
from uuid import UUID

from pydantic import Field

from shared.wire import Wire

# What an alert is about: "xid:<n>", "ecc_dbe", "retired_pages_pending", "remapped_rows_pending", "temperature",
# "power", "nvlink", "heartbeat_lost", "burn_in_failed", "agent_slow".
Condition = str

FaultKind = Literal["xid", "ecc_dbe", "retired_pages", "temperature", "power", "nvlink", "heartbeat_loss",
                    "slow_agent", "node_down", "clear"]


class Alert(Wire):
    """One current problem of the node, as long as it holds."""

    source: str = Field(max_length=64, description='Who saw it: "nvml", "sim", "agent" or "burn_in".')
    target: str = Field(max_length=64, description='What it is about: "node", "gpu:<index>" or "nic:<name>".')
    condition: Condition = Field(max_length=64, pattern=r"^[a-z_]+(:[0-9]+)?$",
                                 description='e.g. "xid:79", "ecc_dbe", "temperature", "heartbeat_lost".')
    since: datetime = Field(description="When the fault began (it stays the same while the fault holds).")
    message: str = Field(max_length=2000, description="What happened, for the provider.")
    tenant_message: str = Field(max_length=2000, description="What it means, for a tenant whose allocation it "
                                                             "touches.")
    classifications: list[str] = Field(default_factory=list, description="Filled by the scheduler's policy; the "
                                                                         "agent leaves it empty.")


class GpuMetrics(Wire):
    """One GPU's sample, named after the DCGM fields it stands for (the agent's /metrics exports them under
    those names, labelled node, gpu and allocation)."""

    gpu: int = Field(ge=0, description="The GPU's index on the node.")
    uuid: str = Field(default="", max_length=64)
    allocation_id: UUID | None = Field(default=None, description="The allocation whose slot holds this GPU.")
    util_pct: float = Field(description="DCGM_FI_DEV_GPU_UTIL: utilisation, percent.")
    fb_used_mib: float = Field(description="DCGM_FI_DEV_FB_USED: framebuffer memory used, MiB.")
    temp_c: float = Field(description="DCGM_FI_DEV_GPU_TEMP: temperature, °C.")
    power_w: float = Field(description="DCGM_FI_DEV_POWER_USAGE: power draw, W.")
    xid_errors: int = Field(default=0, description="DCGM_FI_DEV_XID_ERRORS: the last XID seen (0: none).")
    ecc_dbe: int = Field(default=0, description="DCGM_FI_DEV_ECC_DBE_VOL_TOTAL: volatile double-bit ECC errors.")
    retired_pending: bool = Field(default=False, description="DCGM_FI_DEV_RETIRED_PENDING: pages wait to be "
                                                             "retired (a GPU reset retires them).")


class Heartbeat(Wire):
    """The node's agent is alive: its current alerts, the instances it holds, its GPUs' metrics."""

    node_id: UUID
    seq: int = Field(ge=0, description="Increases by one per heartbeat of this agent process.")
    sent_at: datetime
    started_at: datetime = Field(description="When this agent process started (a new value: it restarted).")
    alerts: list[Alert] = Field(default_factory=list)
    instances: list[UUID] = Field(default_factory=list, description="The allocations whose instances the "
                                                                         "node holds now.")
    gpus: list[GpuMetrics] = Field(default_factory=list)


class InjectFault(Wire):
    """A provider injects a fault into a simulated node (only a node whose health probe simulates accepts it)."""

    node_id: UUID
    kind: FaultKind = Field(description="clear: every injected fault ends.")
    gpu: int | None = Field(default=None, ge=0, le=63, description="The GPU it strikes (GPU faults; default 0).")
    code: int | None = Field(default=None, ge=1, le=1000, description='The XID number for kind "xid".')
    value: float | None = Field(default=None, description="temperature °C, power W, slow_agent delay seconds.")
    duration_s: float | None = Field(default=None, gt=0, le=86400,
                                     description="heartbeat_loss: how long (None: until cleared).")
    request_id: UUID


class FaultInjected(Wire):
    """What the agent did with an injected fault."""

    node_id: UUID
    request_id: UUID
    kind: str
    accepted: bool
    reason: str = Field(default="", max_length=2000)


class FenceInstances(Wire):
    """These allocations moved to another node: destroy their instances here for good (idempotent)."""

    node_id: UUID
    allocation_ids: list[UUID] = Field(min_length=1, max_length=1024)
    reason: str = Field(max_length=2000)


class InstancesFenced(Wire):
    """The allocations' instances are gone from the node, and so are its records of them."""

    node_id: UUID
    allocation_ids: list[UUID]
    at: datetime
