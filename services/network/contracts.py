"""Wire contract of the network service: tenant networks, their security rules, and attachments.

The management commands (create/delete network, add/remove rule) come from the gateway;
each answers with one result event: the new state, or ``network.command_rejected`` with
the precise reason. Every change of a tenant's networks or rules is also published as
``network.tenant_networks_changed`` carrying ALL the tenant's networks (node-agents keep
the highest version per tenant).
"""
from __future__ import annotations

import ipaddress
import uuid
from typing import Annotated, Literal

from pydantic import Field, field_validator

from shared.contract import Message, ServiceContract
from shared.steps import Step
from shared.wire import StepCommand, StepFailure, StepReply, StepUndone, UndoCommand, Wire

# --- the tenant network state a node needs -----------------------------------------------------------------
# The network service fills these; the saga carries the snapshot from the attach reply to the node-agent's
# provision command, and the node-agent receives every later change as ``network.tenant_networks_changed``.
# A snapshot holds ALL networks of one tenant (a node routes between them) and ``version`` only grows: a
# node-agent keeps the highest version it has seen per tenant. Cross-tenant rules cannot be expressed: a
# rule's remote is another network of the same tenant or, for egress only, an outside CIDR (through NAT).


class SecurityRule(Wire):
    id: uuid.UUID
    direction: Literal["ingress", "egress"]
    protocol: Literal["tcp", "udp", "icmp", "any"] = "tcp"
    port_from: int | None = Field(default=None, ge=1, le=65535)
    port_to: int | None = Field(default=None, ge=1, le=65535)
    remote_network_id: uuid.UUID | None = Field(default=None, description="Another network of the same tenant.")
    remote_cidr: str | None = Field(default=None, description="Egress only: an outside CIDR (through the NAT gateway).")


class NetworkSnapshot(Wire):
    network_id: uuid.UUID
    name: str
    vni: int = Field(ge=1, le=16_777_215)
    cidr: str
    gateway_ip: str = Field(description="The subnet's first host: the tenant router's leg on this network.")
    nat_address: str | None = Field(default=None, description="The network's north-south NAT gateway address.")
    vrf_table: int = Field(ge=1, description="Route-table / VRF id of the tenant (the fabric's L3 VNI context).")
    rules: list[SecurityRule] = Field(default_factory=list)


class TenantNetworks(Wire):
    tenant_id: uuid.UUID
    version: int = Field(ge=1)
    pkey: int | None = Field(default=None, ge=1, le=0x7FFF, description="InfiniBand partition key of the tenant.")
    networks: list[NetworkSnapshot]


class SlotAttachment(Wire):
    """One allocation's interface on a tenant network (what the node plumbs)."""

    attachment_id: uuid.UUID
    allocation_id: uuid.UUID
    network_id: uuid.UUID
    ip_address: str
    prefix_len: int = Field(ge=8, le=30)
    mac_address: str


# --- shape checks the gateway applies at its boundary and the network service applies again -----------------
MIN_PREFIX, MAX_PREFIX = 16, 29
PORTED = ("tcp", "udp")
# ranges no host can use as its subnet: a tenant's subnet may not overlap one (whatever the provider allows)
UNUSABLE = {ipaddress.IPv4Network(n): what for n, what in (
    ("0.0.0.0/8", "'this network'"), ("127.0.0.0/8", "loopback"), ("169.254.0.0/16", "link-local"),
    ("224.0.0.0/4", "multicast"), ("240.0.0.0/4", "reserved, with the limited broadcast address"))}
# the same, as a pattern a subnet of /MIN_PREFIX or longer must not match (its first one or two octets)
UNUSABLE_PATTERN = r"^(?:0|127|22[4-9]|2[3-5][0-9])\.|^169\.254\."
# private ranges (RFC 1918, and the shared address space of RFC 6598): a tenant's subnets unless the provider
# allows public ones (the gateway's TESSERA_NETWORKS_ALLOW_PUBLIC_SUBNETS)
PRIVATE = tuple(ipaddress.IPv4Network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10"))


def is_private(net: ipaddress.IPv4Network) -> bool:
    """Whether ``net`` lies within one of the ``PRIVATE`` ranges."""
    return any(net.subnet_of(p) for p in PRIVATE)


def _port_problems(protocol: str, port_from: int | None, port_to: int | None) -> list[tuple[str, str]]:
    if protocol not in PORTED:
        return [(f, f"{protocol} has no ports; leave it out") for f, v in (("port_from", port_from), ("port_to", port_to))
                if v is not None]
    if port_to is not None and port_from is None:
        return [("port_from", "a port range needs port_from")]
    if port_to is not None and port_to < port_from:
        return [("port_to", f"must be ≥ port_from ({port_from})")]
    return []


def _remote_problems(direction: str, remote_network_id: uuid.UUID | None, remote_cidr: str | None) -> list[tuple[str, str]]:
    if direction == "ingress":
        problems = [] if remote_network_id else [("remote_network_id", "an ingress rule names the tenant network it allows")]
        if remote_cidr is not None:
            problems.append(("remote_cidr", "ingress from outside is never allowed; only egress rules take a CIDR"))
        return problems
    problems = [("remote_network_id", "egress rules name an outside CIDR, not a network")] if remote_network_id else []
    if remote_cidr is None:
        return problems + [("remote_cidr", "an egress rule names the outside CIDR it allows")]
    try:
        ipaddress.IPv4Network(remote_cidr, strict=True)
    except (ValueError, TypeError):
        problems.append(("remote_cidr", f"{remote_cidr!r} is not an IPv4 CIDR without host bits, e.g. 203.0.113.0/24"))
    return problems


def rule_problems(direction: str, protocol: str, port_from: int | None, port_to: int | None,
                  remote_network_id: uuid.UUID | None, remote_cidr: str | None) -> list[tuple[str, str]]:
    """(field, message) for each thing wrong with a rule's shape; empty when well formed.
    Ownership of the remote network is checked by ``check_rule``, which knows the tenant."""
    return _port_problems(protocol, port_from, port_to) + _remote_problems(direction, remote_network_id, remote_cidr)


def cidr_problem(text: str) -> str | None:
    """Why ``text`` is not a subnet a tenant may choose (IPv4, /16 to /29, no host bits, overlapping none of the
    ``UNUSABLE`` ranges), or None. Whether a public subnet is allowed is the provider's choice, not checked here."""
    try:
        net = ipaddress.IPv4Network(text, strict=False)
    except (ValueError, TypeError):
        return f"{text!r} is not an IPv4 CIDR such as 10.1.0.0/24"
    if "/" not in text:
        return f"{text!r} needs a prefix length, e.g. {text}/24"
    if not MIN_PREFIX <= net.prefixlen <= MAX_PREFIX:
        return f"prefix /{net.prefixlen} is outside /{MIN_PREFIX}../{MAX_PREFIX}"
    if str(net) != text.strip():
        return f"{text!r} has host bits set; did you mean {net}?"
    for unusable, what in UNUSABLE.items():
        if net.overlaps(unusable):
            return f"{net} is in {unusable} ({what}): no host can use it as its subnet"
    return None


class AttachNetwork(StepCommand):
    node_id: uuid.UUID
    network_id: uuid.UUID | None = Field(default=None, description="A network of the tenant; none: its 'default' network.")
    ip_address: str | None = Field(default=None, description=(
        "The address to keep (a reschedule re-attaches an allocation on another node with the address it had); "
        "none: the next free address. An address that cannot be kept (held by another allocation, outside the "
        "network's subnet, or its network, gateway or broadcast address) does not fail the attach: the slot gets "
        "the next free address and the reply's kept_address is false."), examples=["10.0.0.7"])

    @field_validator("ip_address")
    @classmethod
    def _an_address(cls, value: str | None) -> str | None:
        """An IPv4 or IPv6 address, in its canonical text form (so it compares as text)."""
        if value is None:
            return None
        try:
            return str(ipaddress.ip_address(value.strip()))
        except ValueError:
            raise ValueError(f"{value!r} is not an IPv4 or IPv6 address such as 10.0.0.5") from None


class NetworkAttached(StepReply):
    attachment_id: uuid.UUID
    vni: int
    ip_address: str
    mac_address: str
    node_id: uuid.UUID | None = None
    kept_address: bool = Field(default=True, description=(
        "False when the command asked for an address (ip_address) and the slot got another one instead."))
    attachment: SlotAttachment
    tenant_networks: TenantNetworks


class NetworkAttachFailed(StepFailure):
    pass


class DetachNetwork(UndoCommand):
    pass


class NetworkDetached(StepUndone):
    pass


ATTACH_NETWORK = Step.declare(
    "network",
    command=("attach_network", AttachNetwork, "Saga step: attach the allocation to a network of its tenant."),
    ok=("network_attached", NetworkAttached, "The allocation is attached."),
    failed=("network_attach_failed", NetworkAttachFailed, "The attachment failed."),
    undo=("detach_network", DetachNetwork, "Saga step or compensation: detach the allocation (idempotent)."),
    undone=("network_detached", NetworkDetached, "The allocation has no attachment."),
)


class SwitchPort(Wire):
    """Where a bare-metal server's NIC is cabled: a leaf switch and its port (Ironic's local_link_connection)."""

    leaf: str = Field(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$", examples=["leaf-07"])
    port: str = Field(min_length=1, max_length=15, pattern=r"^[A-Za-z0-9_.:-]+$", examples=["swp12"])


HCA_GUID = r"^0x[0-9a-f]{16}$"


class BindPort(StepCommand):
    node_id: uuid.UUID
    switch_port: SwitchPort
    hca_guids: list[Annotated[str, Field(pattern=HCA_GUID)]] = Field(
        default_factory=list, max_length=16, examples=[["0x0002c903000e0b72"]],
        description="The server's InfiniBand HCA port GUIDs (join the tenant's partition at hand-off).")


class PortBound(StepReply):
    network_id: uuid.UUID
    leaf: str
    port: str
    vlan: int
    vni: int
    phase: Literal["tenant"] = "tenant"
    moved_s: float = Field(ge=0, description="Seconds the move took (the leaf's commands included).")


class PortBindFailed(StepFailure):
    pass


class UnbindPort(UndoCommand):
    pass


class PortUnbound(StepUndone):
    leaf: str | None = None
    port: str | None = None
    moved_s: float = Field(default=0, ge=0, description="Seconds the move back took (0: nothing was bound).")


BIND_PORT = Step.declare(
    "network",
    command=("bind_port", BindPort, "Saga step: move a bare-metal server's switch port from the provisioning "
                                    "network to its tenant network (the attachment's VNI, on its leaf)."),
    ok=("port_bound", PortBound, "The server's port is on its tenant network only."),
    failed=("port_bind_failed", PortBindFailed, "The port was not moved (it stays on the provisioning network)."),
    undo=("unbind_port", UnbindPort, "Saga step or compensation: return the server's port to the provisioning "
                                     "network (idempotent)."),
    undone=("port_unbound", PortUnbound, "The server's port is on the provisioning network."),
)


class PortMoved(Wire):
    """A bare-metal server's port changed network: for operators' streams and the tenant's allocation."""

    tenant_id: uuid.UUID
    allocation_id: uuid.UUID
    node_id: uuid.UUID
    leaf: str
    port: str
    phase: Literal["tenant", "cleaning"] = Field(description="tenant: handed off; cleaning: back on the "
                                                             "provisioning network, for the wipe.")
    vlan: int
    seconds: float = Field(ge=0)


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
        _m("port_moved", "event", PortMoved, "A bare-metal server's switch port moved between the provisioning "
                                             "network and its tenant network."),
    ],
    receives=["network.create_network", "network.delete_network", "network.add_security_rule",
              "network.remove_security_rule"],
    steps=[ATTACH_NETWORK, BIND_PORT],
)
