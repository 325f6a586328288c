"""Tenant networks as the network service publishes them: networks_view, network_rules_view and
network_attachments_view, fed by network.* events (each in the consumer's transaction, inbox-deduped).

Events arrive on separate consumers, in any order: each write only moves a row forward.
"""
from __future__ import annotations

from services.network import contracts as nc
from shared.unit_of_work import UnitOfWork


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
