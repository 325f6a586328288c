"""Wire contract of the network service: tenant networks, their security rules, and attachments.

The management commands (create/delete network, add/remove rule) come from the gateway;
each answers with one result event: the new state, or ``network.command_rejected`` with
the precise reason. Every change of a tenant's networks or rules is also published as
``network.tenant_networks_changed`` carrying ALL the tenant's networks (node-agents keep
the highest version per tenant).
"""
from __future__ import annotations

import uuid
from typing import Literal

from pydantic import Field

from shared.contract import Message, ServiceContract
from shared.netwire import NetworkSnapshot, SecurityRule, SlotAttachment, TenantNetworks
from shared.wire import StepCommand, StepFailure, StepReply, StepUndone, UndoCommand, Wire


class AttachNetwork(StepCommand):
    node_id: uuid.UUID
    network_id: uuid.UUID | None = Field(default=None, description="A network of the tenant; none: its 'default' network.")


class NetworkAttached(StepReply):
    attachment_id: uuid.UUID
    vni: int
    ip_address: str
    mac_address: str
    node_id: uuid.UUID | None = None
    attachment: SlotAttachment
    tenant_networks: TenantNetworks


class NetworkAttachFailed(StepFailure):
    pass


class DetachNetwork(UndoCommand):
    pass


class NetworkDetached(StepUndone):
    pass


class CreateNetwork(Wire):
    network_id: uuid.UUID = Field(description="Chosen by the requester; repeating the command is harmless.")
    tenant_id: uuid.UUID
    name: str
    cidr: str = Field(description="IPv4 subnet, /16 to /29, not overlapping another network of the tenant.")


class DeleteNetwork(Wire):
    network_id: uuid.UUID
    tenant_id: uuid.UUID


class AddSecurityRule(Wire):
    network_id: uuid.UUID
    tenant_id: uuid.UUID
    rule: SecurityRule


class RemoveSecurityRule(Wire):
    network_id: uuid.UUID
    tenant_id: uuid.UUID
    rule_id: uuid.UUID


class NetworkCreated(Wire):
    tenant_id: uuid.UUID
    network: NetworkSnapshot
    version: int = Field(ge=1, description="The tenant's version after the change.")


class NetworkDeleted(Wire):
    tenant_id: uuid.UUID
    network_id: uuid.UUID
    version: int = Field(ge=1)


class SecurityRuleAdded(Wire):
    tenant_id: uuid.UUID
    network_id: uuid.UUID
    rule: SecurityRule
    version: int = Field(ge=1)


class SecurityRuleRemoved(Wire):
    tenant_id: uuid.UUID
    network_id: uuid.UUID
    rule_id: uuid.UUID
    version: int = Field(ge=1)


class NetworkCommandRejected(Wire):
    tenant_id: uuid.UUID
    command: Literal["create_network", "delete_network", "add_security_rule", "remove_security_rule"]
    network_id: uuid.UUID
    rule_id: uuid.UUID | None = None
    reason: str


def _m(name: str, kind: str, model, summary: str) -> Message:
    verb = "cmd" if kind == "command" else "evt"
    return Message(f"network.{name}", f"network.{verb}.{name}", model, kind, summary)


CONTRACT = ServiceContract(
    service="network",
    title="Tessera network service",
    description="Owns tenant networks (pools, IPAM, security rules, NAT, fabric) and the attachment of allocations to them.",
    messages=[
        _m("attach_network", "command", AttachNetwork, "Saga step: attach the allocation to a network of its tenant."),
        _m("detach_network", "command", DetachNetwork, "Saga step or compensation: detach the allocation (idempotent)."),
        _m("network_attached", "event", NetworkAttached, "The allocation is attached."),
        _m("network_attach_failed", "event", NetworkAttachFailed, "The attachment failed."),
        _m("network_detached", "event", NetworkDetached, "The allocation has no attachment."),
        _m("create_network", "command", CreateNetwork, "Create a network of the tenant (idempotent per network_id)."),
        _m("delete_network", "command", DeleteNetwork, "Delete a network that has no attachments."),
        _m("add_security_rule", "command", AddSecurityRule, "Open a path into or out of a network (idempotent per rule id)."),
        _m("remove_security_rule", "command", RemoveSecurityRule, "Remove a rule (idempotent)."),
        _m("network_created", "event", NetworkCreated, "A network exists, with its VNI, gateway and NAT address."),
        _m("network_deleted", "event", NetworkDeleted, "A network and everything it held are released."),
        _m("security_rule_added", "event", SecurityRuleAdded, "A rule is in force."),
        _m("security_rule_removed", "event", SecurityRuleRemoved, "A rule is gone."),
        _m("command_rejected", "event", NetworkCommandRejected, "A management command changed nothing; reason says why."),
        _m("tenant_networks_changed", "event", TenantNetworks, "All networks and rules of a tenant, after a change."),
    ],
    receives=["network.attach_network", "network.detach_network", "network.create_network", "network.delete_network",
              "network.add_security_rule", "network.remove_security_rule"],
)
