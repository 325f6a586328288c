"""Wire contract of the network service (tenant network attachments)."""
from __future__ import annotations

import uuid

from shared.contract import Message, ServiceContract
from shared.wire import StepCommand, StepFailure, StepReply, StepUndone, UndoCommand


class AttachNetwork(StepCommand):
    node_id: uuid.UUID


class NetworkAttached(StepReply):
    attachment_id: uuid.UUID
    vni: int
    ip_address: str
    mac_address: str


class NetworkAttachFailed(StepFailure):
    pass


class DetachNetwork(UndoCommand):
    pass


class NetworkDetached(StepUndone):
    pass


CONTRACT = ServiceContract(
    service="network",
    title="Tessera network service",
    description="Owns tenant networks and the attachment of allocations to them.",
    messages=[
        Message("network.attach_network", "network.cmd.attach_network", AttachNetwork, "command", "Saga step: attach the allocation to its tenant network."),
        Message("network.detach_network", "network.cmd.detach_network", DetachNetwork, "command", "Saga step or compensation: detach the allocation (idempotent)."),
        Message("network.network_attached", "network.evt.network_attached", NetworkAttached, "event", "The allocation is attached."),
        Message("network.network_attach_failed", "network.evt.network_attach_failed", NetworkAttachFailed, "event", "The attachment failed."),
        Message("network.network_detached", "network.evt.network_detached", NetworkDetached, "event", "The allocation has no attachment."),
    ],
    receives=["network.attach_network", "network.detach_network"],
)
