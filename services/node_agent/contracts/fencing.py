"""Wire contract of the fence a move of a bare-metal allocation waits for: the reschedule saga's step that makes
sure the allocation no longer runs on its old node before it is started anywhere else.

On a bare-metal node (the ``redfish`` driver) the server is powered off through its BMC and its power state read
back as Off; on any other node the allocation's instance is removed. Either way the node forgets the instance,
its kept command and its network attachment, so no reconcile brings it back. A fence that cannot be confirmed
is never answered ``node_fenced``: the saga fails the allocation rather than risk it running in two places.
"""
from __future__ import annotations

import uuid
from typing import Literal

from pydantic import Field

from shared.steps import Step
from shared.wire import StepCommand, StepFailure, StepReply


class FenceNode(StepCommand):
    """Make sure the allocation runs no more on this node (idempotent: an absent instance is fenced already)."""

    node_id: uuid.UUID = Field(description="The node the allocation ran on (the old node of a move).")


class NodeFenced(StepReply):
    """The allocation runs no more on the node: the server's power state read back as Off (bare metal), or its
    instance removed (a VM or a slot); the node's records of it are gone."""

    node_id: uuid.UUID
    power_state: Literal["off"] = Field(default="off", description="off: confirmed (read back from the BMC on "
                                                                   "bare metal)")
    seconds: float = Field(ge=0, description="How long the fence took on the node.")


class NodeFenceFailed(StepFailure):
    pass


FENCE_NODE = Step.declare(
    "node_agent", subject_params=("node_id",),
    command=("fence_node", FenceNode, "Saga step: make sure the allocation runs no more on this node (bare metal: "
                                      "powered off through the BMC, the power state read back as Off)."),
    ok=("node_fenced", NodeFenced, "The allocation runs no more on the node (its power-off confirmed)."),
    failed=("node_fence_failed", NodeFenceFailed, "The fence could not be confirmed (the BMC refused or did not "
                                                  "power the server off in time)."),
)
