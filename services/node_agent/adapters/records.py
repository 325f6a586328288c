"""``NodeRecords`` in the node_agent schema (asyncpg, on the caller's connection; the caller owns the transaction).

Every row carries its node's id: one database may serve several node-agents (the tests' nodes, a lab)."""
from __future__ import annotations

import json
import uuid

import asyncpg

from services.network.contracts import SlotAttachment, TenantNetworks

from ..contracts import Bmc, ProvisionNode, SetBmc, SlotWipe
from ..domain.model import Instance, KeptInstance
from ..domain.ports import NodeRecords


class PgNodeRecords(NodeRecords):
    """The records of node ``node_id`` on ``conn``."""

    def __init__(self, conn: asyncpg.Connection, node_id: uuid.UUID):
        self.conn, self.node_id = conn, node_id

    # -- instances ----------------------------------------------------------------------------------------
    def _lock_key(self, allocation_id: uuid.UUID) -> str:
        return f"node_agent:{self.node_id}:{allocation_id}"

    async def lock_allocation(self, allocation_id: uuid.UUID) -> None:
        await self.conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", self._lock_key(allocation_id))

    async def try_lock_allocation(self, allocation_id: uuid.UUID) -> bool:
        return await self.conn.fetchval("SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))",
                                        self._lock_key(allocation_id))

    async def record_instance(self, instance: Instance, command: ProvisionNode | None = None) -> None:
        await self.conn.execute(
            "INSERT INTO instances (node_id, allocation_id, instance_id, slots, state, command) "
            "VALUES ($1, $2, $3, $4, 'running', $5::jsonb) ON CONFLICT (node_id, allocation_id) DO UPDATE "
            "SET instance_id = EXCLUDED.instance_id, slots = EXCLUDED.slots, command = EXCLUDED.command",
            self.node_id, instance.allocation_id, instance.instance_id, list(instance.slots),
            command.model_dump_json() if command is not None else None)

    async def keep_command(self, command: ProvisionNode) -> None:
        await self.conn.execute("UPDATE instances SET command = $3::jsonb WHERE node_id=$1 AND allocation_id=$2",
                                self.node_id, command.allocation_id, command.model_dump_json())

    async def command_of(self, allocation_id: uuid.UUID) -> str | None:
        return await self.conn.fetchval("SELECT command FROM instances WHERE node_id=$1 AND allocation_id=$2",
                                        self.node_id, allocation_id)

    async def instance(self, allocation_id: uuid.UUID) -> KeptInstance | None:
        row = await self.conn.fetchrow("SELECT allocation_id, instance_id, slots, command FROM instances "
                                       "WHERE node_id=$1 AND allocation_id=$2", self.node_id, allocation_id)
        return _kept(row) if row is not None else None

    async def instances(self) -> dict[uuid.UUID, KeptInstance]:
        found = await self.conn.fetch("SELECT allocation_id, instance_id, slots, command FROM instances "
                                      "WHERE node_id=$1", self.node_id)
        return {r["allocation_id"]: _kept(r) for r in found}

    async def forget_instance(self, allocation_id: uuid.UUID) -> str | None:
        return await self.conn.fetchval("DELETE FROM instances WHERE node_id=$1 AND allocation_id=$2 "
                                        "RETURNING instance_id", self.node_id, allocation_id)

    # -- the desired network ------------------------------------------------------------------------------
    async def keep_tenant(self, tenant: TenantNetworks) -> TenantNetworks:
        row = await self.conn.fetchrow(
            "INSERT INTO tenant_networks (node_id, tenant_id, version, snapshot) VALUES ($1, $2, $3, $4::jsonb) "
            "ON CONFLICT (node_id, tenant_id) DO UPDATE SET version = EXCLUDED.version, snapshot = EXCLUDED.snapshot, "
            "updated_at = now() WHERE tenant_networks.version < EXCLUDED.version RETURNING version",
            self.node_id, tenant.tenant_id, tenant.version, tenant.model_dump_json())
        if row is not None:
            return tenant
        stored = await self.conn.fetchval("SELECT snapshot FROM tenant_networks WHERE node_id=$1 AND tenant_id=$2",
                                          self.node_id, tenant.tenant_id)
        return TenantNetworks.model_validate_json(stored)

    async def record_attachment(self, tenant_id: uuid.UUID, attachment: SlotAttachment) -> None:
        await self.conn.execute(
            "INSERT INTO attachments (node_id, allocation_id, tenant_id, attachment) VALUES ($1, $2, $3, $4::jsonb) "
            "ON CONFLICT (node_id, allocation_id) DO UPDATE SET tenant_id = EXCLUDED.tenant_id, "
            "attachment = EXCLUDED.attachment",
            self.node_id, attachment.allocation_id, tenant_id, attachment.model_dump_json())

    async def forget_attachment(self, allocation_id: uuid.UUID) -> bool:
        return await self.conn.fetchval("DELETE FROM attachments WHERE node_id=$1 AND allocation_id=$2 RETURNING true",
                                        self.node_id, allocation_id) is not None

    async def desired_network(self) -> tuple[list[TenantNetworks], list[tuple[uuid.UUID, SlotAttachment]]]:
        tenants = [TenantNetworks.model_validate_json(r["snapshot"]) for r in
                   await self.conn.fetch("SELECT snapshot FROM tenant_networks WHERE node_id=$1", self.node_id)]
        attachments = [(r["tenant_id"], SlotAttachment.model_validate_json(r["attachment"])) for r in
                       await self.conn.fetch("SELECT tenant_id, attachment FROM attachments WHERE node_id=$1",
                                             self.node_id)]
        return tenants, attachments

    # -- hardware -----------------------------------------------------------------------------------------
    async def record_wipes(self, evidence: list[SlotWipe], *, allocation_id: uuid.UUID | None = None,
                           request_id: uuid.UUID | None = None) -> None:
        await self.conn.executemany(
            "INSERT INTO wipes (node_id, allocation_id, request_id, slot, ok, evidence) "
            "VALUES ($1, $2, $3, $4, $5, $6::jsonb)",
            [(self.node_id, allocation_id, request_id, e.slot, e.ok, json.dumps(e.model_dump(mode="json")))
             for e in evidence])

    async def keep_bmc(self, cmd: SetBmc) -> bool:
        return bool(await self.conn.fetchval(
            "INSERT INTO bmcs (node_id, version, bmc, set_by) VALUES ($1, $2, $3::jsonb, $4) "
            "ON CONFLICT (node_id) DO UPDATE SET version = EXCLUDED.version, bmc = EXCLUDED.bmc, "
            "set_by = EXCLUDED.set_by, updated_at = now() WHERE bmcs.version < EXCLUDED.version RETURNING true",
            self.node_id, cmd.version, cmd.bmc.model_dump_json() if cmd.bmc else None, cmd.set_by))

    async def bmc(self) -> Bmc | None:
        raw = await self.conn.fetchval("SELECT bmc FROM bmcs WHERE node_id=$1", self.node_id)
        return Bmc.model_validate_json(raw) if raw else None


def _kept(row: asyncpg.Record) -> KeptInstance:
    return KeptInstance(row["allocation_id"], row["instance_id"], tuple(row["slots"]), row["command"])
