"""networks_view, network_rules_view and network_attachments_view as the HTTP handlers read and request them
(asyncpg; the caller owns the transaction). The projection applies the network service's events
(``api/networks/projection.py``).

Every read takes the caller's tenant: another tenant's network is simply not found.
"""
from __future__ import annotations

import uuid

import asyncpg

from shared.db import in_list

NET_COLS = ("id, tenant_id, name, cidr::text AS cidr, state, host(gateway_ip) AS gateway_ip, "
            "host(nat_address) AS nat_address, reason, created_at, updated_at")
RULE_COLS = ("id, network_id, direction, protocol, port_from, port_to, remote_network_id, remote_cidr, state, reason, "
             "created_at")
LIVE = ("creating", "active", "deleting")
_LIVE = in_list(LIVE)   # written in: the partial index networks_view_live_name holds only these (shared.db.in_list)


async def request_network(conn: asyncpg.Connection, network_id: uuid.UUID, tenant_id: uuid.UUID, name: str, cidr: str,
                          requested_by: uuid.UUID) -> asyncpg.Record | None:
    """The new 'creating' row, or None when the tenant already has a live network of that name."""
    return await conn.fetchrow(
        f"INSERT INTO networks_view (id, tenant_id, name, cidr, state, requested_by) VALUES ($1, $2, $3, $4::cidr, "
        f"'creating', $5) ON CONFLICT DO NOTHING RETURNING {NET_COLS}", network_id, tenant_id, name, cidr, requested_by)


async def overlapping(conn: asyncpg.Connection, tenant_id: uuid.UUID, cidr: str) -> asyncpg.Record | None:
    """A live network of the tenant whose subnet overlaps ``cidr``, if any."""
    return await conn.fetchrow(f"SELECT name, cidr::text AS cidr FROM networks_view WHERE tenant_id=$1 AND state IN {_LIVE} "
                               "AND cidr && $2::cidr LIMIT 1", tenant_id, cidr)


async def get(conn: asyncpg.Connection, network_id: uuid.UUID, tenant_id: uuid.UUID, *,
              for_update: bool = False) -> asyncpg.Record | None:
    lock = " FOR UPDATE" if for_update else ""
    return await conn.fetchrow(f"SELECT {NET_COLS} FROM networks_view WHERE id=$1 AND tenant_id=$2{lock}",
                               network_id, tenant_id)


async def list_networks(conn: asyncpg.Connection, tenant_id: uuid.UUID) -> list[asyncpg.Record]:
    return await conn.fetch(f"SELECT {NET_COLS} FROM networks_view WHERE tenant_id=$1 AND state <> 'deleted' "
                            f"ORDER BY created_at, id", tenant_id)


async def set_state(conn: asyncpg.Connection, network_id: uuid.UUID, state: str) -> asyncpg.Record:
    return await conn.fetchrow(f"UPDATE networks_view SET state=$2, reason=NULL, updated_at=now() WHERE id=$1 "
                               f"RETURNING {NET_COLS}", network_id, state)


async def rules_of(conn: asyncpg.Connection, network_ids: list[uuid.UUID]) -> list[asyncpg.Record]:
    return await conn.fetch(f"SELECT {RULE_COLS} FROM network_rules_view WHERE network_id = ANY($1::uuid[]) "
                            f"ORDER BY created_at, id", network_ids)


async def request_rule(conn: asyncpg.Connection, tenant_id: uuid.UUID, network_id: uuid.UUID, rule: dict) -> asyncpg.Record:
    return await conn.fetchrow(
        f"INSERT INTO network_rules_view (id, network_id, tenant_id, direction, protocol, port_from, port_to, "
        f"remote_network_id, remote_cidr, state) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'adding') RETURNING {RULE_COLS}",
        rule["id"], network_id, tenant_id, rule["direction"], rule["protocol"], rule["port_from"], rule["port_to"],
        rule["remote_network_id"], rule["remote_cidr"])


async def get_rule(conn: asyncpg.Connection, rule_id: uuid.UUID, network_id: uuid.UUID, tenant_id: uuid.UUID, *,
                   for_update: bool = False) -> asyncpg.Record | None:
    lock = " FOR UPDATE" if for_update else ""
    return await conn.fetchrow(f"SELECT {RULE_COLS} FROM network_rules_view WHERE id=$1 AND network_id=$2 "
                               f"AND tenant_id=$3{lock}", rule_id, network_id, tenant_id)


async def set_rule_state(conn: asyncpg.Connection, rule_id: uuid.UUID, state: str) -> asyncpg.Record:
    return await conn.fetchrow(f"UPDATE network_rules_view SET state=$2, reason=NULL, updated_at=now() WHERE id=$1 "
                               f"RETURNING {RULE_COLS}", rule_id, state)


async def attachments_of(conn: asyncpg.Connection, network_id: uuid.UUID) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT allocation_id, attachment_id, host(ip_address) AS ip_address, prefix_len, mac_address, node_id, attached_at "
        "FROM network_attachments_view WHERE network_id=$1 AND detached_at IS NULL ORDER BY ip_address", network_id)
