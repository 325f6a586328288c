"""Tenant networks: provider pools, IP address management, MAC/GUID derivation (pure, no I/O).

A tenant owns one or more overlay networks. Each network gets a VXLAN network
identifier (VNI) and a north-south NAT address from the provider's pools; the
tenant gets one route-table/VRF id, one InfiniBand partition key (PKey) and one
L3 VNI (the VRF's EVPN context, drawn from the same VNI pool so it can never equal
a network's VNI). Every pool hands out its lowest free value. Within a network the
first host is the gateway (the tenant router's leg); slots get the next free hosts.
"""
from __future__ import annotations

import hashlib
import ipaddress
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar

VNI_MIN, VNI_MAX = 1, (1 << 24) - 1   # a VNI is 24 bits; 0 is reserved
DEFAULT_NETWORK = "default"
DEFAULT_TENANT_CIDR = ipaddress.IPv4Network("10.0.0.0/24")    # the implicit default network's first choice
DEFAULT_POOL = ipaddress.IPv4Network("10.0.0.0/8")            # where it is drawn from when that one is taken
DEFAULT_NAT_CIDR = ipaddress.IPv4Network("198.51.100.0/24")   # documentation range: configure a real one


@dataclass(frozen=True)
class IdPool:
    """An inclusive range of integer ids a provider hands out, lowest free first."""

    first: int
    last: int
    bounds: ClassVar[tuple[int, int]] = (1, (1 << 31) - 1)
    what: ClassVar[str] = "id"

    def __post_init__(self) -> None:
        lo, hi = self.bounds
        if not lo <= self.first <= self.last <= hi:
            raise ValueError(f"{self.what} pool {self.first}–{self.last} must satisfy {lo} ≤ first ≤ last ≤ {hi}")

    @property
    def size(self) -> int:
        return self.last - self.first + 1

    def lowest_free(self, used: Iterable[int]) -> int | None:
        """The lowest id of the pool not in ``used`` (values outside the pool are ignored), or None."""
        candidate = self.first
        for value in sorted(set(used)):
            if value < candidate:
                continue
            if value > candidate:
                break
            candidate += 1
        return candidate if candidate <= self.last else None

    def describe(self) -> str:
        return f"{self.what} pool {self.first}–{self.last}"


@dataclass(frozen=True)
class VniPool(IdPool):
    first: int = 10_000
    last: int = VNI_MAX
    bounds: ClassVar[tuple[int, int]] = (VNI_MIN, VNI_MAX)
    what: ClassVar[str] = "VNI"


@dataclass(frozen=True)
class VrfPool(IdPool):
    """Route-table ids: above 255 so the kernel's reserved tables (253 default, 254 main, 255 local) stay clear."""

    first: int = 1000
    last: int = 64_999
    bounds: ClassVar[tuple[int, int]] = (256, (1 << 31) - 1)
    what: ClassVar[str] = "VRF table"


@dataclass(frozen=True)
class PKeyPool(IdPool):
    """15-bit InfiniBand partition keys; 0x7FFF (the default partition) and 0 are never handed out."""

    first: int = 0x0001
    last: int = 0x7FFE
    bounds: ClassVar[tuple[int, int]] = (0x0001, 0x7FFE)
    what: ClassVar[str] = "PKey"


@dataclass(frozen=True)
class VlanPool(IdPool):
    """Leaf-local VLAN ids carrying a network's L2 VNI on one leaf switch; ``reserved`` (the leaves' provisioning
    VLAN) is never handed out."""

    first: int = 2
    last: int = 4094
    reserved: frozenset[int] = frozenset()
    bounds: ClassVar[tuple[int, int]] = (1, 4094)
    what: ClassVar[str] = "VLAN"

    def lowest_free(self, used: Iterable[int]) -> int | None:
        return super().lowest_free({*used, *self.reserved})


@dataclass(frozen=True)
class AddressPool(IdPool):
    """IPv4 addresses as integers."""

    bounds: ClassVar[tuple[int, int]] = (0, (1 << 32) - 1)
    what: ClassVar[str] = "address"


def nat_pool(cidr: ipaddress.IPv4Network) -> AddressPool:
    """The NAT gateway addresses of a provider CIDR (its hosts) as an id pool of integers."""
    first, last = _host_bounds(cidr)
    return AddressPool(int(first), int(last))


def _host_bounds(cidr: ipaddress.IPv4Network) -> tuple[ipaddress.IPv4Address, ipaddress.IPv4Address]:
    if cidr.prefixlen >= 31:
        raise ValueError(f"{cidr} has no host addresses")
    return cidr.network_address + 1, cidr.broadcast_address - 1


def gateway_ip(cidr: ipaddress.IPv4Network) -> ipaddress.IPv4Address:
    """The subnet's first host: the tenant router's leg on the network."""
    return _host_bounds(cidr)[0]


def slot_range(cidr: ipaddress.IPv4Network) -> tuple[ipaddress.IPv4Address, ipaddress.IPv4Address]:
    """The addresses a slot may take: the hosts after the gateway (network, gateway and broadcast excluded)."""
    first, last = _host_bounds(cidr)
    return first + 1, last


def wanted_slot_address(cidr: ipaddress.IPv4Network, wanted: str | None) -> ipaddress.IPv4Address | None:
    """``wanted`` as an address of ``slot_range``, or None when there is no such wish or it is not one (an IPv6
    address never is: tenant subnets are IPv4)."""
    if wanted is None:
        return None
    try:
        address = ipaddress.IPv4Address(wanted)
    except ValueError:
        return None
    first, last = slot_range(cidr)
    return address if first <= address <= last else None


def free_address(first: ipaddress.IPv4Address, last: ipaddress.IPv4Address, wanted: ipaddress.IPv4Address | None,
                 used: Iterable[ipaddress.IPv4Address]) -> ipaddress.IPv4Address | None:
    """The rule a slot's address follows: ``wanted`` (an address of [first, last]) when not in ``used``, else the
    lowest address of [first, last] not in ``used``; None when all are. (``NetworkRepository.free_address``
    applies it where the attachments are stored.)"""
    taken = set(used)
    if wanted is not None and wanted not in taken:
        return wanted
    address = first
    while address <= last:
        if address not in taken:
            return address
        address += 1
    return None


def mac_for(attachment_id: uuid.UUID) -> str:
    """A deterministic, locally administered, unicast MAC for the attachment (02:xx:... style).

    Derived from a hash of the id, so the same attachment always gets the same MAC; the
    locally-administered bit is set and the multicast bit cleared in the first octet."""
    digest = bytearray(hashlib.sha256(attachment_id.bytes).digest()[:6])
    digest[0] = (digest[0] & 0b11111100) | 0b00000010
    return ":".join(f"{b:02x}" for b in digest)


def guid_for(attachment_id: uuid.UUID) -> str:
    """A deterministic 64-bit InfiniBand port GUID for the slot's VF, 16 lowercase hex digits.

    Used when the node reported no VF GUID; the top octet is 0x02 (locally assigned), so it
    never collides with a vendor-assigned (OUI-based) GUID."""
    digest = hashlib.sha256(b"ib-guid:" + attachment_id.bytes).digest()
    return "02" + digest[:7].hex()


@dataclass(frozen=True)
class LeafMap:
    """Which leaf switch serves a node: an explicit map, else a deterministic leaf among ``count``."""

    explicit: dict[uuid.UUID, str] = field(default_factory=dict)
    count: int = 4

    def __post_init__(self) -> None:
        if not 1 <= self.count <= 9999:
            raise ValueError(f"leaf count {self.count} must be between 1 and 9999")

    def leaf_of(self, node_id: uuid.UUID) -> str:
        if node_id in self.explicit:
            return self.explicit[node_id]
        n = int.from_bytes(hashlib.sha256(node_id.bytes).digest()[:4], "big") % self.count
        return f"leaf-{n + 1:02d}"


@dataclass(frozen=True)
class NetworkPlan:
    """The provider's plan: pools, the default network's subnet (its first choice and size) and the range it is
    drawn from when that one is taken, and the node → leaf map."""

    vnis: VniPool = VniPool()
    tenant_cidr: ipaddress.IPv4Network = DEFAULT_TENANT_CIDR
    vrfs: VrfPool = VrfPool()
    pkeys: PKeyPool = PKeyPool()
    nat_cidr: ipaddress.IPv4Network = DEFAULT_NAT_CIDR
    leaves: LeafMap = LeafMap()
    default_pool: ipaddress.IPv4Network = DEFAULT_POOL
    provisioning_vlan: int = 4094   # the leaves' VLAN for deploying and cleaning bare-metal servers

    @property
    def vlans(self) -> VlanPool:
        """The leaf-local VLANs tenant networks may lease: all but the provisioning VLAN."""
        return VlanPool(reserved=frozenset({self.provisioning_vlan}))

    def __post_init__(self) -> None:
        if self.tenant_cidr.prefixlen > 30:
            raise ValueError(f"tenant subnet {self.tenant_cidr} is too small: it needs a gateway and a slot address")
        if self.default_pool.prefixlen > self.tenant_cidr.prefixlen:
            raise ValueError(f"default network pool {self.default_pool} is smaller than one default network "
                             f"(/{self.tenant_cidr.prefixlen})")
        if self.nat_cidr.prefixlen > 30:
            raise ValueError(f"NAT pool {self.nat_cidr} is too small: it needs host addresses")

    @property
    def nats(self) -> IdPool:
        return nat_pool(self.nat_cidr)

    def default_subnet(self, taken: Iterable[ipaddress.IPv4Network]) -> ipaddress.IPv4Network | None:
        """The subnet of a tenant's implicit default network, given the subnets of its networks (``taken``):
        ``tenant_cidr`` when it overlaps none of them, else the lowest subnet of its size in ``default_pool``
        that overlaps none; None when the pool has none left."""
        taken = list(taken)
        if not any(t.overlaps(self.tenant_cidr) for t in taken):
            return self.tenant_cidr
        size, prefix = self.tenant_cidr.num_addresses, self.tenant_cidr.prefixlen
        addr, end = int(self.default_pool.network_address), int(self.default_pool.broadcast_address)
        while addr + size - 1 <= end:
            candidate = ipaddress.IPv4Network((addr, prefix))
            clash = next((t for t in taken if t.overlaps(candidate)), None)
            if clash is None:
                return candidate
            # skip past the clash, to the next boundary of the size: one step per clash, not per candidate
            past = max(int(clash.broadcast_address), int(candidate.broadcast_address)) + 1
            addr = -(-past // size) * size
        return None


@dataclass(frozen=True)
class TenantNetwork:
    id: uuid.UUID
    tenant_id: uuid.UUID
    vni: int
    cidr: ipaddress.IPv4Network
    name: str = DEFAULT_NETWORK
    nat_address: ipaddress.IPv4Address | None = None

    @property
    def gateway(self) -> ipaddress.IPv4Address:
        return gateway_ip(self.cidr)


@dataclass(frozen=True)
class TenantResources:
    """What a tenant holds while it has at least one network; ``version`` only grows."""

    tenant_id: uuid.UUID
    version: int
    vrf_table: int | None
    pkey: int | None
    l3_vni: int | None


@dataclass(frozen=True)
class Attachment:
    id: uuid.UUID
    allocation_id: uuid.UUID
    network_id: uuid.UUID
    vni: int
    ip_address: ipaddress.IPv4Address
    mac_address: str
    node_id: uuid.UUID
    guid: str = ""
    leaf: str = ""


@dataclass(frozen=True)
class PortBinding:
    """A bare-metal server's switch port on its tenant's network: the leaf-local VLAN carrying the network's VNI,
    and the server's InfiniBand HCA GUIDs in the tenant's partition. Its absence: the port is on the provisioning
    network (the leaf's day-0 configuration)."""
    allocation_id: uuid.UUID
    tenant_id: uuid.UUID
    network_id: uuid.UUID
    node_id: uuid.UUID
    leaf: str
    port: str
    vlan: int
    vni: int
    hca_guids: tuple[str, ...] = ()
