"""Tenant networks and attachments in the network schema (asyncpg; the caller owns the transaction)."""
from __future__ import annotations

import ipaddress
import uuid

import asyncpg

from ..domain.model import Attachment, TenantNetwork, VniPool

# Network creation takes this transaction-scoped advisory lock, so two tenants' first attachments
# never choose the same "lowest free" VNI (the unique constraint would only turn that into a retry).
_VNI_POOL_LOCK = "network.vni_pool"


def _network(row: asyncpg.Record) -> TenantNetwork:
    return TenantNetwork(row["id"], row["tenant_id"], row["vni"], ipaddress.IPv4Network(row["cidr"]))


async def default_network(conn: asyncpg.Connection, tenant_id: uuid.UUID) -> TenantNetwork | None:
    row = await conn.fetchrow("SELECT id, tenant_id, vni, cidr FROM tenant_networks WHERE tenant_id=$1 AND is_default",
                              tenant_id)
    return _network(row) if row else None


async def lock_vni_pool(conn: asyncpg.Connection) -> None:
    """Serialise network creation until the transaction ends (may block)."""
    await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", _VNI_POOL_LOCK)


async def used_vnis(conn: asyncpg.Connection, pool: VniPool) -> list[int]:
    rows = await conn.fetch("SELECT vni FROM tenant_networks WHERE vni BETWEEN $1 AND $2 ORDER BY vni", pool.first, pool.last)
    return [r["vni"] for r in rows]


async def add_network(conn: asyncpg.Connection, net: TenantNetwork) -> None:
    await conn.execute("INSERT INTO tenant_networks (id, tenant_id, vni, cidr) VALUES ($1, $2, $3, $4)",
                       net.id, net.tenant_id, net.vni, net.cidr)


async def lock_network(conn: asyncpg.Connection, network_id: uuid.UUID) -> None:
    """Lock the network row until the transaction ends: address assignment in it is serialised (may block)."""
    await conn.execute("SELECT 1 FROM tenant_networks WHERE id=$1 FOR UPDATE", network_id)


async def used_addresses(conn: asyncpg.Connection, network_id: uuid.UUID) -> list[ipaddress.IPv4Address]:
    rows = await conn.fetch("SELECT host(ip_address) AS ip FROM attachments WHERE network_id=$1", network_id)
    return [ipaddress.IPv4Address(r["ip"]) for r in rows]


async def attachment_for(conn: asyncpg.Connection, allocation_id: uuid.UUID) -> Attachment | None:
    row = await conn.fetchrow(
        "SELECT a.id, a.allocation_id, a.network_id, n.vni, host(a.ip_address) AS ip, a.mac_address::text AS mac, a.node_id "
        "FROM attachments a JOIN tenant_networks n ON n.id = a.network_id WHERE a.allocation_id=$1", allocation_id)
    if row is None:
        return None
    return Attachment(row["id"], row["allocation_id"], row["network_id"], row["vni"], ipaddress.IPv4Address(row["ip"]),
                      row["mac"], row["node_id"])


async def add_attachment(conn: asyncpg.Connection, a: Attachment) -> None:
    await conn.execute(
        "INSERT INTO attachments (id, allocation_id, network_id, ip_address, mac_address, node_id) "
        "VALUES ($1, $2, $3, $4::text::inet, $5::text::macaddr, $6)",
        a.id, a.allocation_id, a.network_id, str(a.ip_address), a.mac_address, a.node_id)


async def delete_attachment(conn: asyncpg.Connection, allocation_id: uuid.UUID) -> bool:
    """Delete the allocation's attachment; False if it had none (idempotent)."""
    return bool(await conn.fetchval("DELETE FROM attachments WHERE allocation_id=$1 RETURNING true", allocation_id))
