"""Tenants, networks, rules and pool leases in the network schema (asyncpg; the caller owns the transaction).

Locking order, always: the tenant's advisory lock, then pool locks (vrf, pkey, vni, nat,
vlan:<leaf>), then network rows. Taking them in one order everywhere rules out deadlocks.
"""
from __future__ import annotations

import ipaddress
import uuid

import asyncpg

from services.network.contracts import SecurityRule

from ..domain.model import IdPool, TenantNetwork, TenantResources

_NET_COLS = "id, tenant_id, vni, cidr, name, host(nat_address) AS nat"


async def _xact_lock(conn: asyncpg.Connection, key: str) -> None:
    await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", key)


async def lock_tenant(conn: asyncpg.Connection, tenant_id: uuid.UUID) -> None:
    """Serialise every change of one tenant's networks, rules and attachments (may block)."""
    await _xact_lock(conn, f"network.tenant:{tenant_id}")


async def lease(conn: asyncpg.Connection, pool_name: str, pool: IdPool, owner: uuid.UUID) -> int | None:
    """The value ``owner`` holds in the pool, leasing the lowest free one if it holds none; None when
    the pool is exhausted. Serialised per pool by an advisory lock; the primary key backs it up."""
    value = await held(conn, pool_name, owner)
    if value is not None:
        return value
    await _xact_lock(conn, f"network.pool:{pool_name}")
    used = await conn.fetch("SELECT value FROM pool_leases WHERE pool=$1 AND value BETWEEN $2 AND $3",
                            pool_name, pool.first, pool.last)
    value = pool.lowest_free(r["value"] for r in used)
    if value is not None:
        await conn.execute("INSERT INTO pool_leases (pool, value, owner) VALUES ($1, $2, $3)", pool_name, value, owner)
    return value


async def held(conn: asyncpg.Connection, pool_name: str, owner: uuid.UUID) -> int | None:
    return await conn.fetchval("SELECT value FROM pool_leases WHERE pool=$1 AND owner=$2", pool_name, owner)


async def release(conn: asyncpg.Connection, owner: uuid.UUID, pool_name: str | None = None) -> None:
    """Give back what ``owner`` holds (in one pool, or in all). Idempotent."""
    if pool_name is None:
        await conn.execute("DELETE FROM pool_leases WHERE owner=$1", owner)
    else:
        await conn.execute("DELETE FROM pool_leases WHERE owner=$1 AND pool=$2", owner, pool_name)


def _network(row: asyncpg.Record) -> TenantNetwork:
    nat = ipaddress.IPv4Address(row["nat"]) if row["nat"] else None
    return TenantNetwork(row["id"], row["tenant_id"], row["vni"], ipaddress.IPv4Network(row["cidr"]), row["name"], nat)


async def networks_of(conn: asyncpg.Connection, tenant_id: uuid.UUID) -> list[TenantNetwork]:
    rows = await conn.fetch(f"SELECT {_NET_COLS} FROM tenant_networks WHERE tenant_id=$1 ORDER BY created_at, id", tenant_id)
    return [_network(r) for r in rows]


async def add_network(conn: asyncpg.Connection, net: TenantNetwork, *, is_default: bool = False) -> None:
    await conn.execute(
        "INSERT INTO tenant_networks (id, tenant_id, vni, cidr, name, nat_address, is_default) "
        "VALUES ($1, $2, $3, $4, $5, $6::text::inet, $7)",
        net.id, net.tenant_id, net.vni, net.cidr, net.name, str(net.nat_address) if net.nat_address else None, is_default)


async def delete_network(conn: asyncpg.Connection, network_id: uuid.UUID) -> None:
    """Delete the network, its rules and rules naming it (cascade), and release its VNI and NAT address."""
    await conn.execute("DELETE FROM tenant_networks WHERE id=$1", network_id)
    await release(conn, network_id)


async def lock_network(conn: asyncpg.Connection, network_id: uuid.UUID) -> None:
    """Lock the network row until the transaction ends: address assignment in it is serialised (may block)."""
    await conn.execute("SELECT 1 FROM tenant_networks WHERE id=$1 FOR UPDATE", network_id)


async def count_attachments(conn: asyncpg.Connection, network_id: uuid.UUID) -> int:
    return await conn.fetchval("SELECT count(*) FROM attachments WHERE network_id=$1", network_id)


def _resources(row: asyncpg.Record) -> TenantResources:
    return TenantResources(row["tenant_id"], row["version"], row["vrf_table"], row["pkey"], row["l3_vni"])


async def tenant(conn: asyncpg.Connection, tenant_id: uuid.UUID) -> TenantResources:
    """The tenant's row (created, at version 0 and holding nothing, on first use)."""
    row = await conn.fetchrow("INSERT INTO tenants (tenant_id) VALUES ($1) ON CONFLICT (tenant_id) DO UPDATE "
                              "SET tenant_id = EXCLUDED.tenant_id RETURNING *", tenant_id)
    return _resources(row)


async def set_tenant_resources(conn: asyncpg.Connection, tenant_id: uuid.UUID, vrf_table: int | None, pkey: int | None,
                               l3_vni: int | None) -> None:
    await conn.execute("UPDATE tenants SET vrf_table=$2, pkey=$3, l3_vni=$4 WHERE tenant_id=$1",
                       tenant_id, vrf_table, pkey, l3_vni)


async def bump_version(conn: asyncpg.Connection, tenant_id: uuid.UUID) -> TenantResources:
    row = await conn.fetchrow("UPDATE tenants SET version = version + 1 WHERE tenant_id=$1 RETURNING *", tenant_id)
    return _resources(row)


def _rule(row: asyncpg.Record) -> SecurityRule:
    return SecurityRule(id=row["id"], direction=row["direction"], protocol=row["protocol"], port_from=row["port_from"],
                        port_to=row["port_to"], remote_network_id=row["remote_network_id"],
                        remote_cidr=str(row["remote_cidr"]) if row["remote_cidr"] else None)


async def rules_of(conn: asyncpg.Connection, network_ids: list[uuid.UUID]) -> dict[uuid.UUID, list[SecurityRule]]:
    rows = await conn.fetch("SELECT * FROM security_rules WHERE network_id = ANY($1::uuid[]) ORDER BY created_at, id",
                            network_ids)
    out: dict[uuid.UUID, list[SecurityRule]] = {n: [] for n in network_ids}
    for r in rows:
        out[r["network_id"]].append(_rule(r))
    return out


async def rule(conn: asyncpg.Connection, rule_id: uuid.UUID) -> tuple[uuid.UUID, SecurityRule] | None:
    """(network id, rule) of ``rule_id``, or None."""
    row = await conn.fetchrow("SELECT * FROM security_rules WHERE id=$1", rule_id)
    return (row["network_id"], _rule(row)) if row else None


async def add_rule(conn: asyncpg.Connection, network_id: uuid.UUID, r: SecurityRule) -> None:
    await conn.execute(
        "INSERT INTO security_rules (id, network_id, direction, protocol, port_from, port_to, remote_network_id, remote_cidr) "
        "VALUES ($1, $2, $3, $4, $5, $6, $7, $8::text::cidr)",
        r.id, network_id, r.direction, r.protocol, r.port_from, r.port_to, r.remote_network_id, r.remote_cidr)


async def delete_rule(conn: asyncpg.Connection, rule_id: uuid.UUID) -> None:
    await conn.execute("DELETE FROM security_rules WHERE id=$1", rule_id)


async def network_exists(conn: asyncpg.Connection, network_id: uuid.UUID) -> bool:
    return bool(await conn.fetchval("SELECT 1 FROM tenant_networks WHERE id=$1", network_id))
