"""The one fabric-driver interface: what an attachment arriving on / leaving the fabric must change.

A driver renders the exact calls its fabric manager would receive (``attach_calls`` /
``detach_calls``: pure, no I/O, deterministic) and ``send``s them. The drivers in this
package are *recording* drivers: ``send`` writes each rendered call to the network
schema's ``fabric_calls`` table in the caller's transaction, so a call exists exactly when
the attach/detach that caused it commits, and tests can assert the payloads. A real
switch or UFM driver is a NEW class implementing this interface whose ``send`` talks to
the device (e.g. queues the calls and delivers them with retries); the renderers stay.
"""
from __future__ import annotations

import abc
import ipaddress
import json
import uuid
from dataclasses import dataclass
from typing import ClassVar, Literal

import asyncpg

Action = Literal["attach", "detach", "bind", "unbind"]


@dataclass(frozen=True)
class FabricCall:
    """One request to a fabric manager: method, absolute URL and JSON body (None: no body)."""

    method: str
    url: str
    body: dict | None


@dataclass(frozen=True)
class FabricChange:
    """One slot attachment arriving on (attach) or leaving (detach) the fabric.

    The ``*_alone_*`` flags say whether this attachment is the only one of its kind: on
    attach, the first (so the thing must be created); on detach, the last (so it goes)."""

    tenant_id: uuid.UUID
    network_id: uuid.UUID
    vni: int
    cidr: ipaddress.IPv4Network
    gateway_ip: ipaddress.IPv4Address
    vrf_table: int
    l3_vni: int
    pkey: int
    allocation_id: uuid.UUID
    guid: str
    node_id: uuid.UUID
    leaf: str
    vlan: int
    network_alone_on_leaf: bool
    tenant_alone_on_leaf: bool
    tenant_alone: bool


@dataclass(frozen=True)
class PortChange:
    """A bare-metal server's switch port moving onto its tenant's network (bind) or back to the provisioning network
    (unbind), with the HCA GUIDs that join or leave the tenant's InfiniBand partition."""

    tenant_id: uuid.UUID
    network_id: uuid.UUID
    allocation_id: uuid.UUID
    node_id: uuid.UUID
    leaf: str
    port: str
    vlan: int
    vni: int
    pkey: int | None
    hca_guids: tuple[str, ...]
    address: str | None = None   # the server's address on the network (probed before the port joins it)


class FabricRefused(Exception):
    """The fabric refused a change (a leaf without the port, a command that failed); ``reason`` says what."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class FabricDriver(abc.ABC):
    """Programs one fabric (switches, subnet manager) for attachments. Renderers are pure."""

    name: ClassVar[str]

    @abc.abstractmethod
    def attach_calls(self, change: FabricChange) -> list[FabricCall]:
        """The calls that make the fabric carry the new attachment (may be empty)."""

    @abc.abstractmethod
    def detach_calls(self, change: FabricChange) -> list[FabricCall]:
        """The calls that remove what only this attachment needed (may be empty)."""

    def bind_calls(self, change: PortChange) -> list[FabricCall]:
        """The calls that put a server's port on its tenant network (none: this fabric has no part in it)."""
        return []

    def unbind_calls(self, change: PortChange) -> list[FabricCall]:
        """The calls that return a server's port to the provisioning network."""
        return []

    async def send(self, conn: asyncpg.Connection, action: Action, change: FabricChange | PortChange,
                   calls: list[FabricCall]) -> None:
        """Deliver ``calls``: recording drivers store them in ``fabric_calls`` in the caller's transaction."""
        await record(conn, self.name, action, change, calls)

    async def apply(self, conn: asyncpg.Connection, action: Action, change: FabricChange) -> list[FabricCall]:
        """Render and send the calls for ``action``; returns them."""
        calls = self.attach_calls(change) if action == "attach" else self.detach_calls(change)
        await self.send(conn, action, change, calls)
        return calls

    async def move_port(self, conn: asyncpg.Connection, action: Action, change: PortChange) -> list[FabricCall]:
        """Render and send a port's move (``bind`` or ``unbind``); returns the calls. Raises FabricRefused."""
        calls = self.bind_calls(change) if action == "bind" else self.unbind_calls(change)
        await self.send(conn, action, change, calls)
        return calls

    async def settle(self, conn: asyncpg.Connection, leaf: str, restore: tuple[str, ...] = ()) -> None:
        """After a refused change was rolled back: bring ``leaf`` back to what the database says (a driver that
        changes devices as it goes; a recording driver has nothing to undo)."""


async def record(conn: asyncpg.Connection, driver: str, action: Action, change: FabricChange | PortChange,
                 calls: list[FabricCall]) -> None:
    """Store ``calls`` in ``fabric_calls``, in the caller's transaction."""
    rows = [(driver, action, change.tenant_id, change.network_id, change.allocation_id, c.method, c.url,
             None if c.body is None else json.dumps(c.body)) for c in calls]
    if rows:
        await conn.executemany(
            "INSERT INTO fabric_calls (driver, action, tenant_id, network_id, allocation_id, method, url, body) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb)", rows)
