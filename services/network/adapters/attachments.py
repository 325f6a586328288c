"""Attachments (one per allocation) and the fabric's per-leaf view of them (asyncpg; caller's transaction)."""
from __future__ import annotations

import ipaddress
import uuid

import asyncpg

from ..domain.model import Attachment

_COLS = ("a.id, a.allocation_id, a.network_id, n.vni, host(a.ip_address) AS ip, a.mac_address::text AS mac, a.node_id, "
         "a.guid, a.leaf")


def _attachment(row: asyncpg.Record) -> Attachment:
    return Attachment(row["id"], row["allocation_id"], row["network_id"], row["vni"], ipaddress.IPv4Address(row["ip"]),
                      row["mac"], row["node_id"], row["guid"] or "", row["leaf"] or "")


async def used_addresses(conn: asyncpg.Connection, network_id: uuid.UUID) -> list[ipaddress.IPv4Address]:
    rows = await conn.fetch("SELECT host(ip_address) AS ip FROM attachments WHERE network_id=$1", network_id)
    return [ipaddress.IPv4Address(r["ip"]) for r in rows]


async def attachment_for(conn: asyncpg.Connection, allocation_id: uuid.UUID) -> tuple[Attachment, uuid.UUID] | None:
    """(attachment, tenant id) of the allocation, or None."""
    row = await conn.fetchrow(f"SELECT {_COLS}, n.tenant_id FROM attachments a JOIN tenant_networks n "
                              f"ON n.id = a.network_id WHERE a.allocation_id=$1", allocation_id)
    return (_attachment(row), row["tenant_id"]) if row else None


async def add_attachment(conn: asyncpg.Connection, a: Attachment) -> None:
    await conn.execute(
        "INSERT INTO attachments (id, allocation_id, network_id, ip_address, mac_address, node_id, guid, leaf) "
        "VALUES ($1, $2, $3, $4::text::inet, $5::text::macaddr, $6, $7, $8)",
        a.id, a.allocation_id, a.network_id, str(a.ip_address), a.mac_address, a.node_id, a.guid, a.leaf)


async def delete_attachment(conn: asyncpg.Connection, allocation_id: uuid.UUID) -> None:
    await conn.execute("DELETE FROM attachments WHERE allocation_id=$1", allocation_id)


async def on_leaf(conn: asyncpg.Connection, leaf: str, tenant_id: uuid.UUID, network_id: uuid.UUID) -> tuple[int, int]:
    """(attachments of the network on the leaf, attachments of any network of the tenant on the leaf)."""
    row = await conn.fetchrow(
        "SELECT count(*) FILTER (WHERE a.network_id=$3) AS network, count(*) AS tenant FROM attachments a "
        "JOIN tenant_networks n ON n.id = a.network_id WHERE a.leaf=$1 AND n.tenant_id=$2", leaf, tenant_id, network_id)
    return row["network"], row["tenant"]


async def tenant_attachment_count(conn: asyncpg.Connection, tenant_id: uuid.UUID) -> int:
    return await conn.fetchval("SELECT count(*) FROM attachments a JOIN tenant_networks n ON n.id = a.network_id "
                               "WHERE n.tenant_id=$1", tenant_id)
