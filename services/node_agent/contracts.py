"""Wire contract of the node-agent (one process per node; subjects carry the node id)."""
from __future__ import annotations

import uuid
from typing import Literal

from pydantic import Field

from shared.contract import Message, ServiceContract
from shared.steps import Step
from services.network.contracts import SlotAttachment, TenantNetworks
from shared.wire import StepCommand, StepFailure, StepReply, StepUndone, UndoCommand, Wire


class ProvisionNode(StepCommand):
    node_id: uuid.UUID
    slots: list[int]
    volume_id: uuid.UUID | None = None
    ip_address: str | None = None
    mac_address: str | None = None
    attachment: SlotAttachment | None = Field(default=None, description="The allocation's interface to plumb on the node.")
    tenant_networks: TenantNetworks | None = Field(default=None, description="The tenant's networks and rules (with attachment).")


class NodeProvisioned(StepReply):
    node_id: uuid.UUID
    instance_id: str


class NodeProvisionFailed(StepFailure):
    pass


class DeprovisionNode(UndoCommand):
    node_id: uuid.UUID


class NodeDeprovisioned(StepUndone):
    node_id: uuid.UUID


PROVISION_NODE = Step.declare(
    "node_agent", subject_params=("node_id",),
    command=("provision", ProvisionNode, "Saga step: provision the allocation on this node."),
    ok=("node_provisioned", NodeProvisioned, "The allocation runs on the node."),
    failed=("node_provision_failed", NodeProvisionFailed, "Provisioning failed on the node."),
    undo=("deprovision", DeprovisionNode, "Saga step or compensation: remove the allocation from this node (idempotent)."),
    undone=("node_deprovisioned", NodeDeprovisioned, "Nothing of the allocation is left on the node."),
)


class NetworkRepaired(Wire):
    """One repair the node's reconcile made: the kernel had drifted from the desired state."""

    node_id: uuid.UUID
    action: Literal["create", "remove", "replace"]
    object: str = Field(description="'<kind>:<name>', e.g. 'vxlan:tvx0000c8' or 'slot:ts-1a2b3c4d-...'.")
    detail: str = ""


CONTRACT = ServiceContract(
    service="node_agent",
    title="Tessera node-agent",
    description="Runs on each node; provisions and deprovisions allocations through its driver and plumbs their tenant networks.",
    messages=[
        Message("node_agent.network_repaired", "node_agent.evt.network_repaired.{node_id}", NetworkRepaired, "event", "Reconcile found the node's network drifted and repaired one object."),
    ],
    receives=["network.tenant_networks_changed"],
    sends=["scheduler.report_topology"],
    steps=[PROVISION_NODE],
)
