"""The network schema: the asyncpg ``NetworkRepository``, on the unit of work's connection (the caller owns
the transaction).

Locking order, always: the tenant's advisory lock, then pool locks (vrf, pkey, vni, nat,
vlan:<leaf>), then network rows. Taking them in one order everywhere rules out deadlocks.
"""
from __future__ import annotations

import contextlib
import ipaddress
import uuid
from collections.abc import AsyncIterator

import asyncpg

from services.network.contracts import SecurityRule

from ..domain.model import Attachment, IdPool, PortBinding, TenantNetwork, TenantResources
from ..domain.ports import NetworkRepository

_NET_COLS = "id, tenant_id, vni, cidr, name, host(nat_address) AS nat"
_ATT_COLS = ("a.id, a.allocation_id, a.network_id, n.vni, host(a.ip_address) AS ip, a.mac_address::text AS mac, "
             "a.node_id, a.guid, a.leaf")


def _network(row: asyncpg.Record) -> TenantNetwork:
    nat = ipaddress.IPv4Address(row["nat"]) if row["nat"] else None
    return TenantNetwork(row["id"], row["tenant_id"], row["vni"], ipaddress.IPv4Network(row["cidr"]), row["name"], nat)


def _resources(row: asyncpg.Record) -> TenantResources:
    return TenantResources(row["tenant_id"], row["version"], row["vrf_table"], row["pkey"], row["l3_vni"])


def _rule(row: asyncpg.Record) -> SecurityRule:
    return SecurityRule(id=row["id"], direction=row["direction"], protocol=row["protocol"], port_from=row["port_from"],
                        port_to=row["port_to"], remote_network_id=row["remote_network_id"],
                        remote_cidr=str(row["remote_cidr"]) if row["remote_cidr"] else None)


def _attachment(row: asyncpg.Record) -> Attachment:
    return Attachment(row["id"], row["allocation_id"], row["network_id"], row["vni"], ipaddress.IPv4Address(row["ip"]),
                      row["mac"], row["node_id"], row["guid"] or "", row["leaf"] or "")


class PgNetworkRepository(NetworkRepository):
    """One handler's repository (built per message or step, on its transaction's connection). What it read of a
    tenant's row and networks it keeps until it writes them, so the several parts of one step (the network to
    use, the fabric's view, the reply's snapshot) read each once; a savepoint that rolls back forgets it all."""

    def __init__(self, conn: asyncpg.Connection):
        self.conn = conn
        self._tenants: dict[uuid.UUID, TenantResources] = {}
        self._networks: dict[uuid.UUID, list[TenantNetwork]] = {}

    def _forget(self) -> None:
        self._tenants.clear()
        self._networks.clear()

    @contextlib.asynccontextmanager
    async def savepoint(self) -> AsyncIterator[None]:
        try:
            async with self.conn.transaction():
                yield
        except BaseException:
            self._forget()   # what was read inside may have been written inside, and is undone now
            raise

    async def _xact_lock(self, key: str) -> None:
        await self.conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", key)

    # --- locks ---------------------------------------------------------------------------------------------------
    async def lock_tenant(self, tenant_id: uuid.UUID) -> None:
        await self._xact_lock(f"network.tenant:{tenant_id}")

    async def lock_network(self, network_id: uuid.UUID) -> None:
        await self.conn.execute("SELECT 1 FROM tenant_networks WHERE id=$1 FOR UPDATE", network_id)

    # --- pools: serialised per pool by an advisory lock; the primary key backs it up -------------------------------
    async def lease(self, pool_name: str, pool: IdPool, owner: uuid.UUID) -> int | None:
        value = await self.held(pool_name, owner)
        if value is not None:
            return value
        await self._xact_lock(f"network.pool:{pool_name}")
        used = await self.conn.fetch("SELECT value FROM pool_leases WHERE pool=$1 AND value BETWEEN $2 AND $3",
                                     pool_name, pool.first, pool.last)
        value = pool.lowest_free(r["value"] for r in used)
        if value is not None:
            await self.conn.execute("INSERT INTO pool_leases (pool, value, owner) VALUES ($1, $2, $3)",
                                    pool_name, value, owner)
        return value

    async def held(self, pool_name: str, owner: uuid.UUID) -> int | None:
        return await self.conn.fetchval("SELECT value FROM pool_leases WHERE pool=$1 AND owner=$2", pool_name, owner)

    async def release(self, owner: uuid.UUID, pool_name: str | None = None) -> None:
        if pool_name is None:
            await self.conn.execute("DELETE FROM pool_leases WHERE owner=$1", owner)
        else:
            await self.conn.execute("DELETE FROM pool_leases WHERE owner=$1 AND pool=$2", owner, pool_name)

    # --- tenants -------------------------------------------------------------------------------------------------
    async def tenant(self, tenant_id: uuid.UUID) -> TenantResources:
        if (known := self._tenants.get(tenant_id)) is not None:
            return known
        row = await self.conn.fetchrow("INSERT INTO tenants (tenant_id) VALUES ($1) ON CONFLICT (tenant_id) DO UPDATE "
                                       "SET tenant_id = EXCLUDED.tenant_id RETURNING *", tenant_id)
        self._tenants[tenant_id] = res = _resources(row)
        return res

    async def set_tenant_resources(self, tenant_id: uuid.UUID, vrf_table: int | None, pkey: int | None,
                                   l3_vni: int | None) -> None:
        self._tenants.pop(tenant_id, None)
        await self.conn.execute("UPDATE tenants SET vrf_table=$2, pkey=$3, l3_vni=$4 WHERE tenant_id=$1",
                                tenant_id, vrf_table, pkey, l3_vni)

    async def bump_version(self, tenant_id: uuid.UUID) -> TenantResources:
        self._tenants.pop(tenant_id, None)
        row = await self.conn.fetchrow("UPDATE tenants SET version = version + 1 WHERE tenant_id=$1 RETURNING *",
                                       tenant_id)
        self._tenants[tenant_id] = res = _resources(row)
        return res

    # --- networks ------------------------------------------------------------------------------------------------
    async def networks_of(self, tenant_id: uuid.UUID) -> list[TenantNetwork]:
        if (known := self._networks.get(tenant_id)) is None:
            rows = await self.conn.fetch(f"SELECT {_NET_COLS} FROM tenant_networks WHERE tenant_id=$1 "
                                         "ORDER BY created_at, id", tenant_id)
            self._networks[tenant_id] = known = [_network(r) for r in rows]
        return list(known)

    async def network_exists(self, network_id: uuid.UUID) -> bool:
        return bool(await self.conn.fetchval("SELECT 1 FROM tenant_networks WHERE id=$1", network_id))

    async def add_network(self, net: TenantNetwork, *, is_default: bool = False) -> None:
        self._networks.pop(net.tenant_id, None)
        await self.conn.execute(
            "INSERT INTO tenant_networks (id, tenant_id, vni, cidr, name, nat_address, is_default) "
            "VALUES ($1, $2, $3, $4, $5, $6::text::inet, $7)",
            net.id, net.tenant_id, net.vni, net.cidr, net.name, str(net.nat_address) if net.nat_address else None,
            is_default)

    async def delete_network(self, network_id: uuid.UUID) -> None:
        self._networks.clear()   # whose it was is not known here
        await self.conn.execute("DELETE FROM tenant_networks WHERE id=$1", network_id)   # rules: cascade
        await self.release(network_id)

    # --- security rules ------------------------------------------------------------------------------------------
    async def rules_of(self, network_ids: list[uuid.UUID]) -> dict[uuid.UUID, list[SecurityRule]]:
        rows = await self.conn.fetch("SELECT * FROM security_rules WHERE network_id = ANY($1::uuid[]) "
                                     "ORDER BY created_at, id", network_ids)
        out: dict[uuid.UUID, list[SecurityRule]] = {n: [] for n in network_ids}
        for r in rows:
            out[r["network_id"]].append(_rule(r))
        return out

    async def rule(self, rule_id: uuid.UUID) -> tuple[uuid.UUID, SecurityRule] | None:
        row = await self.conn.fetchrow("SELECT * FROM security_rules WHERE id=$1", rule_id)
        return (row["network_id"], _rule(row)) if row else None

    async def add_rule(self, network_id: uuid.UUID, r: SecurityRule) -> None:
        await self.conn.execute(
            "INSERT INTO security_rules (id, network_id, direction, protocol, port_from, port_to, remote_network_id, "
            "remote_cidr) VALUES ($1, $2, $3, $4, $5, $6, $7, $8::text::cidr)",
            r.id, network_id, r.direction, r.protocol, r.port_from, r.port_to, r.remote_network_id, r.remote_cidr)

    async def delete_rule(self, rule_id: uuid.UUID) -> None:
        await self.conn.execute("DELETE FROM security_rules WHERE id=$1", rule_id)

    # --- attachments (one per allocation) and the fabric's per-leaf view of them ---------------------------------
    async def attachment_for(self, allocation_id: uuid.UUID) -> tuple[Attachment, uuid.UUID] | None:
        row = await self.conn.fetchrow(f"SELECT {_ATT_COLS}, n.tenant_id FROM attachments a JOIN tenant_networks n "
                                       f"ON n.id = a.network_id WHERE a.allocation_id=$1", allocation_id)
        return (_attachment(row), row["tenant_id"]) if row else None

    async def add_attachment(self, a: Attachment) -> None:
        await self.conn.execute(
            "INSERT INTO attachments (id, allocation_id, network_id, ip_address, mac_address, node_id, guid, leaf) "
            "VALUES ($1, $2, $3, $4::text::inet, $5::text::macaddr, $6, $7, $8)",
            a.id, a.allocation_id, a.network_id, str(a.ip_address), a.mac_address, a.node_id, a.guid, a.leaf)

    async def delete_attachment(self, allocation_id: uuid.UUID) -> None:
        await self.conn.execute("DELETE FROM attachments WHERE allocation_id=$1", allocation_id)

    async def free_address(self, network_id: uuid.UUID, first: ipaddress.IPv4Address, last: ipaddress.IPv4Address,
                           wanted: ipaddress.IPv4Address | None) -> ipaddress.IPv4Address | None:
        # in the database, over the (network_id, ip_address) index: no row is read out to find a gap. ``gap``: the
        # first offset from ``first`` that no address holds (the held ones, in order, are 0, 1, 2... up to it)
        row = await self.conn.fetchrow(
            "SELECT NOT EXISTS (SELECT 1 FROM attachments WHERE network_id=$1 AND ip_address = $4::text::inet) AS wanted_free, "
            "(SELECT coalesce(min(n) FILTER (WHERE off <> n), count(*)) FROM "
            " (SELECT ip_address - $2::text::inet AS off, row_number() OVER (ORDER BY ip_address) - 1 AS n "
            "  FROM attachments WHERE network_id=$1 AND ip_address BETWEEN $2::text::inet AND $3::text::inet) held) AS gap",
            network_id, str(first), str(last), str(wanted) if wanted is not None else None)
        if wanted is not None and row["wanted_free"]:
            return wanted
        address = first + row["gap"]
        return address if address <= last else None

    async def count_attachments(self, network_id: uuid.UUID) -> int:
        return await self.conn.fetchval("SELECT count(*) FROM attachments WHERE network_id=$1", network_id)

    async def on_leaf(self, leaf: str, tenant_id: uuid.UUID, network_id: uuid.UUID) -> tuple[int, int, int]:
        row = await self.conn.fetchrow(
            "SELECT count(*) FILTER (WHERE a.leaf=$1 AND a.network_id=$3) AS network, "
            "count(*) FILTER (WHERE a.leaf=$1) AS on_leaf, count(*) AS tenant FROM attachments a "
            "JOIN tenant_networks n ON n.id = a.network_id WHERE n.tenant_id=$2",
            leaf, tenant_id, network_id)
        return row["network"], row["on_leaf"], row["tenant"]

    # --- bare-metal port bindings --------------------------------------------------------------------------------
    async def binding_for(self, allocation_id: uuid.UUID) -> PortBinding | None:
        row = await self.conn.fetchrow("SELECT * FROM port_bindings WHERE allocation_id=$1", allocation_id)
        return _binding(row) if row else None

    async def port_holder(self, leaf: str, port: str) -> uuid.UUID | None:
        return await self.conn.fetchval("SELECT allocation_id FROM port_bindings WHERE leaf=$1 AND port=$2", leaf, port)

    async def add_binding(self, b: PortBinding) -> None:
        await self.conn.execute(
            "INSERT INTO port_bindings (allocation_id, tenant_id, network_id, node_id, leaf, port, vlan, vni, hca_guids) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)", b.allocation_id, b.tenant_id, b.network_id, b.node_id,
            b.leaf, b.port, b.vlan, b.vni, list(b.hca_guids))

    async def delete_binding(self, allocation_id: uuid.UUID) -> None:
        await self.conn.execute("DELETE FROM port_bindings WHERE allocation_id=$1", allocation_id)

    async def rehome(self, allocation_id: uuid.UUID, leaf: str) -> None:
        await self.conn.execute("UPDATE attachments SET leaf=$2 WHERE allocation_id=$1", allocation_id, leaf)


def _binding(row) -> PortBinding:
    return PortBinding(row["allocation_id"], row["tenant_id"], row["network_id"], row["node_id"], row["leaf"],
                       row["port"], row["vlan"], row["vni"], tuple(row["hca_guids"]))
