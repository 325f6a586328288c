"""networks_view, network_rules_view and network_attachments_view (asyncpg; the caller owns the transaction).

Every read takes the caller's tenant: another tenant's network is simply not found.
"""
from __future__ import annotations

import uuid

import asyncpg

from services.network import contracts as nc
from shared.unit_of_work import UnitOfWork

NET_COLS = ("id, tenant_id, name, cidr::text AS cidr, state, host(gateway_ip) AS gateway_ip, "
            "host(nat_address) AS nat_address, reason, created_at, updated_at")
RULE_COLS = ("id, network_id, direction, protocol, port_from, port_to, remote_network_id, remote_cidr, state, reason, "
             "created_at")
LIVE = ("creating", "active", "deleting")


async def request_network(conn: asyncpg.Connection, network_id: uuid.UUID, tenant_id: uuid.UUID, name: str, cidr: str,
                          requested_by: uuid.UUID) -> asyncpg.Record | None:
    """The new 'creating' row, or None when the tenant already has a live network of that name."""
    return await conn.fetchrow(
        f"INSERT INTO networks_view (id, tenant_id, name, cidr, state, requested_by) VALUES ($1, $2, $3, $4::cidr, "
        f"'creating', $5) ON CONFLICT DO NOTHING RETURNING {NET_COLS}", network_id, tenant_id, name, cidr, requested_by)


async def overlapping(conn: asyncpg.Connection, tenant_id: uuid.UUID, cidr: str) -> asyncpg.Record | None:
    """A live network of the tenant whose subnet overlaps ``cidr``, if any."""
    return await conn.fetchrow("SELECT name, cidr::text AS cidr FROM networks_view WHERE tenant_id=$1 AND state = ANY($3) "
                               "AND cidr && $2::cidr LIMIT 1", tenant_id, cidr, list(LIVE))


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


# --- projection: network.* events → the views (each in the consumer's transaction, inbox-deduped) ---------
# Events arrive on separate consumers, in any order: each write only moves a row forward.

async def on_network_created(ctx: UnitOfWork, data: nc.NetworkCreated) -> None:
    n = data.network
    # The service made the tenant's implicit "default" network while a POST of another network of that
    # name was pending: the service refuses that POST (name taken); say so now, so the names stay unique.
    await ctx.conn.execute(
        "UPDATE networks_view SET state='rejected', reason=$4, updated_at=now() "
        "WHERE tenant_id=$1 AND name=$2 AND id<>$3 AND state='creating'",
        data.tenant_id, n.name, n.network_id, f"name: the tenant already has a network named {n.name!r}")
    await ctx.conn.execute(
        "INSERT INTO networks_view (id, tenant_id, name, cidr, state, gateway_ip, nat_address) "
        "VALUES ($1, $2, $3, $4::cidr, 'active', $5::inet, $6::inet) ON CONFLICT (id) DO UPDATE SET "
        "gateway_ip=EXCLUDED.gateway_ip, nat_address=EXCLUDED.nat_address, updated_at=now(), "
        "state = CASE WHEN networks_view.state = 'creating' THEN 'active' ELSE networks_view.state END",
        n.network_id, data.tenant_id, n.name, n.cidr, n.gateway_ip, n.nat_address)


async def on_network_deleted(ctx: UnitOfWork, data: nc.NetworkDeleted) -> None:
    await ctx.conn.execute("UPDATE networks_view SET state='deleted', reason=NULL, updated_at=now() WHERE id=$1",
                           data.network_id)
    # the service deleted the network's rules and every rule naming it
    await ctx.conn.execute("DELETE FROM network_rules_view WHERE network_id=$1 OR remote_network_id=$1", data.network_id)


async def on_rule_added(ctx: UnitOfWork, data: nc.SecurityRuleAdded) -> None:
    r = data.rule
    await ctx.conn.execute(
        "INSERT INTO network_rules_view (id, network_id, tenant_id, direction, protocol, port_from, port_to, "
        "remote_network_id, remote_cidr, state) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'active') "
        "ON CONFLICT (id) DO UPDATE SET state = CASE WHEN network_rules_view.state = 'adding' THEN 'active' "
        "ELSE network_rules_view.state END, updated_at=now()",
        r.id, data.network_id, data.tenant_id, r.direction, r.protocol, r.port_from, r.port_to, r.remote_network_id,
        r.remote_cidr)


async def on_rule_removed(ctx: UnitOfWork, data: nc.SecurityRuleRemoved) -> None:
    await ctx.conn.execute("DELETE FROM network_rules_view WHERE id=$1 AND network_id=$2", data.rule_id, data.network_id)


_UNDO_REQUEST = {  # command → (table, id column, state it was requested in, state it returns to)
    "create_network": ("networks_view", "network_id", "creating", "rejected"),
    "delete_network": ("networks_view", "network_id", "deleting", "active"),
    "add_security_rule": ("network_rules_view", "rule_id", "adding", "rejected"),
    "remove_security_rule": ("network_rules_view", "rule_id", "removing", "active"),
}


async def on_command_rejected(ctx: UnitOfWork, data: nc.NetworkCommandRejected) -> None:
    """The request changed nothing: the row leaves its requested state, showing the service's reason."""
    table, key, requested, back = _UNDO_REQUEST[data.command]
    row_id = data.network_id if key == "network_id" else data.rule_id
    await ctx.conn.execute(f"UPDATE {table} SET state=$2, reason=$3, updated_at=now() WHERE id=$1 AND state=$4",
                           row_id, back, data.reason, requested)


async def on_network_attached(ctx: UnitOfWork, data: nc.NetworkAttached) -> None:
    a = data.attachment
    await ctx.conn.execute(
        "INSERT INTO network_attachments_view (allocation_id, tenant_id, network_id, attachment_id, ip_address, "
        "prefix_len, mac_address, node_id, attached_at) VALUES ($1, $2, $3, $4, $5::inet, $6, $7, $8, now()) "
        "ON CONFLICT (allocation_id) DO NOTHING",
        a.allocation_id, data.tenant_networks.tenant_id, a.network_id, a.attachment_id, a.ip_address, a.prefix_len,
        a.mac_address, data.node_id)


async def on_network_detached(ctx: UnitOfWork, data: nc.NetworkDetached) -> None:
    await ctx.conn.execute(
        "INSERT INTO network_attachments_view (allocation_id, detached_at) VALUES ($1, now()) "
        "ON CONFLICT (allocation_id) DO UPDATE SET detached_at = coalesce(network_attachments_view.detached_at, now())",
        data.allocation_id)


HANDLERS = {
    "network.network_created": on_network_created,
    "network.network_deleted": on_network_deleted,
    "network.security_rule_added": on_rule_added,
    "network.security_rule_removed": on_rule_removed,
    "network.command_rejected": on_command_rejected,
    "network.network_attached": on_network_attached,
    "network.network_detached": on_network_detached,
}
