"""Tenant networks: VNI allocation, IP address management and MAC derivation (pure, no I/O).

Every tenant gets one default overlay network on first use: a VXLAN network
identifier (VNI) from the provider's pool, the lowest free one, and the same
private subnet for every tenant (CIDRs may overlap; the VNI isolates them).
Each allocation attached to it gets the subnet's lowest free host address and a
MAC derived from the attachment id.
"""
from __future__ import annotations

import hashlib
import ipaddress
import uuid
from dataclasses import dataclass
from typing import Iterable

VNI_MIN, VNI_MAX = 1, (1 << 24) - 1   # a VNI is 24 bits; 0 is reserved


@dataclass(frozen=True)
class VniPool:
    """The inclusive range of VNIs this provider hands to tenant networks."""

    first: int = 10_000
    last: int = VNI_MAX

    def __post_init__(self) -> None:
        if not VNI_MIN <= self.first <= self.last <= VNI_MAX:
            raise ValueError(f"VNI pool {self.first}–{self.last} must satisfy {VNI_MIN} ≤ first ≤ last ≤ {VNI_MAX}")

    @property
    def size(self) -> int:
        return self.last - self.first + 1

    def lowest_free(self, used: Iterable[int]) -> int | None:
        """The lowest VNI of the pool not in ``used`` (values outside the pool are ignored), or None."""
        candidate = self.first
        for vni in sorted(set(used)):
            if vni < candidate:
                continue
            if vni > candidate:
                break
            candidate += 1
        return candidate if candidate <= self.last else None


@dataclass(frozen=True)
class NetworkPlan:
    """The provider's addressing plan: the VNI pool and the subnet every tenant network gets."""

    vnis: VniPool = VniPool()
    tenant_cidr: ipaddress.IPv4Network = ipaddress.IPv4Network("10.0.0.0/24")

    def __post_init__(self) -> None:
        if self.tenant_cidr.num_addresses < 4:
            raise ValueError(f"tenant subnet {self.tenant_cidr} is too small: it needs at least one host address")


def lowest_free_host(cidr: ipaddress.IPv4Network, used: Iterable[ipaddress.IPv4Address]) -> ipaddress.IPv4Address | None:
    """The lowest host address of ``cidr`` (network and broadcast addresses excluded) not in ``used``, or None."""
    taken = set(used)
    for host in cidr.hosts():
        if host not in taken:
            return host
    return None


def mac_for(attachment_id: uuid.UUID) -> str:
    """A deterministic, locally administered, unicast MAC for the attachment (02:xx:... style).

    Derived from a hash of the id, so the same attachment always gets the same MAC; the
    locally-administered bit is set and the multicast bit cleared in the first octet."""
    digest = bytearray(hashlib.sha256(attachment_id.bytes).digest()[:6])
    digest[0] = (digest[0] & 0b11111100) | 0b00000010
    return ":".join(f"{b:02x}" for b in digest)


@dataclass(frozen=True)
class TenantNetwork:
    id: uuid.UUID
    tenant_id: uuid.UUID
    vni: int
    cidr: ipaddress.IPv4Network


@dataclass(frozen=True)
class Attachment:
    id: uuid.UUID
    allocation_id: uuid.UUID
    network_id: uuid.UUID
    vni: int
    ip_address: ipaddress.IPv4Address
    mac_address: str
    node_id: uuid.UUID
