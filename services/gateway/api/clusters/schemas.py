"""HTTP models of tenant clusters: the request to create one, to scale it, and the cluster as shown.

Names, kinds and bounds are the paas service's own (services.paas.contracts): a body the gateway accepts is one
the service accepts.
"""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import ClassVar

from pydantic import ConfigDict, Field, model_validator

from services.paas.contracts import CLUSTER_NAME_PATTERN, MAX_NODES, ClusterState, Kind, NodeState

from ...domain.scheduling import TOLERATION
from ...http.schema_base import Body, Int, Out, ShapeName, Uuid, constraints, integer, text

ClusterName = text(31, min_length=1, pattern=CLUSTER_NAME_PATTERN)
NodeCount = integer(1, MAX_NODES)
Toleration = text(200, pattern=TOLERATION)
# exactly one form: a shape and a node count (new allocations, placed as a gang), or allocations the tenant holds;
# a null stands for the field left out (the document states it as this oneOf)
_NOT_NULL, _NULL = {"not": {"type": "null"}}, {"type": "null"}
_ONE_FORM = {"oneOf": [
    {"required": ["shape", "nodes"], "properties": {"shape": _NOT_NULL, "nodes": _NOT_NULL, "allocation_ids": _NULL}},
    {"required": ["allocation_ids"], "properties": {"allocation_ids": _NOT_NULL, "shape": _NULL, "nodes": _NULL}}]}
_OWNED = frozenset({"id", "tenant_id", "user_id", "state", "reason", "driver", "controller", "gpu_count",
                    "node_count", "requested_node_count", "version", "created_at", "updated_at", "links"})


class AutoscalingIn(Body):
    model_config = ConfigDict(json_schema_extra=constraints("min_nodes <= max_nodes"))
    min_nodes: NodeCount = Field(description="The fewest nodes it shrinks to.")
    max_nodes: NodeCount = Field(description="The most nodes it grows to (not below min_nodes).")
    target_gpu_util: float = Field(default=0.7, gt=0, le=1, description="Window-mean GPU utilisation to keep under.")
    cooldown_s: integer(0, 86400) = Field(default=300, description="Seconds between two scale changes.")

    @model_validator(mode="after")
    def _ordered(self) -> AutoscalingIn:
        if self.min_nodes > self.max_nodes:
            raise ValueError("min_nodes must not exceed max_nodes")
        return self


class ClusterCreate(Body):
    model_config = ConfigDict(json_schema_extra=_ONE_FORM)
    server_owned: ClassVar[frozenset[str]] = _OWNED
    name: ClusterName = Field(description="Lower-case letters, digits and '-', starting with a letter, at most 31; "
                                          "unique among the tenant's live clusters (a 409). Its nodes are named "
                                          "<name>-<index>.")
    kind: Kind = Field(description="slurm or ray (run for real on the nodes) or kubernetes (rendered by a recording "
                                   "driver only: nothing is started).")
    shape: ShapeName | None = Field(default=None, description="One of the shapes GET /v1/shapes lists: every node is "
                                                             "one allocation of it. With `nodes`; not with "
                                                             "`allocation_ids`.")
    nodes: NodeCount | None = Field(default=None, description=f"How many nodes (allocations), 1 to {MAX_NODES}, "
                                                              "placed all or nothing. With `shape`.")
    allocation_ids: list[Uuid] | None = Field(
        default=None, min_length=1, max_length=MAX_NODES, json_schema_extra={"uniqueItems": True},
        description=f"Instead of `shape` and `nodes`: 1 to {MAX_NODES} allocations the tenant already holds, each "
                    "once, in node order (the first hosts the controller). They must be ACTIVE, attached to one "
                    "network of the tenant, of one shape (the cluster's) and not spot, and no live cluster's nodes "
                    "(each refusal names the allocation). The cluster starts on them at once; a scale-in or a "
                    "delete drains them and stops the cluster's daemons on them but never releases them.")
    network_id: Uuid | None = Field(default=None, description="A network of the tenant (GET /v1/networks) the nodes "
                                                              "attach to; another tenant's is a 404.")
    pool: ShapeName | None = Field(default=None, description="The node pool to place in (default: the shared pool).")
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=16, description="'key=value:NoSchedule' entries: taints its nodes tolerate.")
    priority: integer(-1000, 1000) = Field(default=0, description="Scheduling priority of its allocations.")
    autoscaling: AutoscalingIn | None = Field(default=None, description=(
        "Grow and shrink by GPU use between min_nodes and max_nodes; a `nodes` outside them is moved within them "
        "by the autoscaler's first step."))

    @model_validator(mode="after")
    def _one_form(self) -> ClusterCreate:
        new = self.shape is not None and self.nodes is not None
        held = self.allocation_ids is not None
        if held == new or (held and (self.shape is not None or self.nodes is not None)):
            raise ValueError("give either shape and nodes, or allocation_ids")
        if held and len(set(self.allocation_ids)) != len(self.allocation_ids):
            raise ValueError("allocation_ids names an allocation twice")
        return self


class ClusterScale(Body):
    server_owned: ClassVar[frozenset[str]] = _OWNED
    nodes: Int = Field(ge=1, le=MAX_NODES, description="The node count to grow or shrink to (shrinking drains "
                                                        "first).")


class ClusterNodeOut(Out):
    """One node: an allocation of the tenant, and its address on the tenant network once it has one."""

    name: str
    allocation_id: uuid.UUID
    state: NodeState
    address: str | None = None
    adopted: bool = Field(default=False, description="An allocation the tenant held before the cluster: a scale-in "
                                                     "or a delete returns it (`returned`), never releases it.")


class AutoscalingOut(Out):
    min_nodes: int
    max_nodes: int
    target_gpu_util: float
    cooldown_s: int


class ClusterLinks(Out):
    self: str
    jobs: str


class ClusterOut(Out):
    """A tenant cluster: placing, queued, provisioning, starting, ready, scaling, deleting, deleted or failed."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    user_id: uuid.UUID | None = Field(description="Who created it.")
    name: str
    kind: Kind
    shape: str
    gpu_count: int = Field(description="GPUs per node (the shape's).")
    node_count: int = Field(description="The nodes it should have (a scale step moves towards it).")
    requested_node_count: int | None = Field(description="A scale asked for and not yet taken up (null: none).")
    network_id: uuid.UUID | None
    pool: str | None
    priority: int
    state: ClusterState
    reason: str | None = Field(description="Why it failed, or why it waits.")
    driver: str | None = Field(description="What runs the cluster's scheduler: `slurm` or `ray` run for real on the "
                                           "nodes; `recording` (kind kubernetes) only renders and records what it "
                                           "would run, nothing is started. Null until the cluster is started.")
    controller: str | None = Field(description="The controller's address on the tenant network.")
    nodes: list[ClusterNodeOut]
    autoscaling: AutoscalingOut | None
    spot: bool
    version: int = Field(description="The paas service's version of it (0: not yet answered).")
    created_at: datetime
    updated_at: datetime
    links: ClusterLinks


class ClusterPage(Out):
    """One page of the tenant's clusters (deleted ones left out), newest first."""

    items: list[ClusterOut]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next (older) page; null on the last page.")
