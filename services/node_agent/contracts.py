"""Wire contract of the node-agent (one process per node; subjects carry the node id)."""
from __future__ import annotations

import uuid

from shared.contract import Message, ServiceContract
from shared.wire import StepCommand, StepFailure, StepReply, StepUndone, UndoCommand


class ProvisionNode(StepCommand):
    node_id: uuid.UUID
    slots: list[int]
    volume_id: uuid.UUID | None = None
    ip_address: str | None = None
    mac_address: str | None = None


class NodeProvisioned(StepReply):
    node_id: uuid.UUID
    instance_id: str


class NodeProvisionFailed(StepFailure):
    pass


class DeprovisionNode(UndoCommand):
    node_id: uuid.UUID


class NodeDeprovisioned(StepUndone):
    node_id: uuid.UUID


CONTRACT = ServiceContract(
    service="node_agent",
    title="Tessera node-agent",
    description="Runs on each node; provisions and deprovisions allocations through its driver.",
    messages=[
        Message("node_agent.provision", "node_agent.cmd.provision.{node_id}", ProvisionNode, "command", "Saga step: provision the allocation on this node."),
        Message("node_agent.deprovision", "node_agent.cmd.deprovision.{node_id}", DeprovisionNode, "command", "Saga step or compensation: remove the allocation from this node (idempotent)."),
        Message("node_agent.node_provisioned", "node_agent.evt.node_provisioned.{node_id}", NodeProvisioned, "event", "The allocation runs on the node."),
        Message("node_agent.node_provision_failed", "node_agent.evt.node_provision_failed.{node_id}", NodeProvisionFailed, "event", "Provisioning failed on the node."),
        Message("node_agent.node_deprovisioned", "node_agent.evt.node_deprovisioned.{node_id}", NodeDeprovisioned, "event", "Nothing of the allocation is left on the node."),
    ],
    receives=["node_agent.provision", "node_agent.deprovision"],
)
