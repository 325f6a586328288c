"""The node's desired network inputs in the node_agent schema (asyncpg; the caller owns the transaction)."""
from __future__ import annotations

import uuid

import asyncpg

from services.network.contracts import SlotAttachment, TenantNetworks


async def keep_tenant(conn: asyncpg.Connection, node_id: uuid.UUID, tenant: TenantNetworks) -> TenantNetworks:
    """Store the snapshot unless a newer one is stored; returns the newest stored (idempotent)."""
    row = await conn.fetchrow(
        "INSERT INTO tenant_networks (node_id, tenant_id, version, snapshot) VALUES ($1, $2, $3, $4::jsonb) "
        "ON CONFLICT (node_id, tenant_id) DO UPDATE SET version = EXCLUDED.version, snapshot = EXCLUDED.snapshot, "
        "updated_at = now() WHERE tenant_networks.version < EXCLUDED.version RETURNING version",
        node_id, tenant.tenant_id, tenant.version, tenant.model_dump_json())
    if row is not None:
        return tenant
    stored = await conn.fetchval("SELECT snapshot FROM tenant_networks WHERE node_id=$1 AND tenant_id=$2",
                                 node_id, tenant.tenant_id)
    return TenantNetworks.model_validate_json(stored)


async def record_attachment(conn: asyncpg.Connection, node_id: uuid.UUID, tenant_id: uuid.UUID,
                            attachment: SlotAttachment) -> None:
    await conn.execute(
        "INSERT INTO attachments (node_id, allocation_id, tenant_id, attachment) VALUES ($1, $2, $3, $4::jsonb) "
        "ON CONFLICT (node_id, allocation_id) DO UPDATE SET tenant_id = EXCLUDED.tenant_id, attachment = EXCLUDED.attachment",
        node_id, attachment.allocation_id, tenant_id, attachment.model_dump_json())


async def forget_attachment(conn: asyncpg.Connection, node_id: uuid.UUID, allocation_id: uuid.UUID) -> bool:
    return await conn.fetchval("DELETE FROM attachments WHERE node_id=$1 AND allocation_id=$2 RETURNING true",
                               node_id, allocation_id) is not None


async def load(conn: asyncpg.Connection, node_id: uuid.UUID) -> tuple[list[TenantNetworks], list[tuple[uuid.UUID, SlotAttachment]]]:
    """Everything the node should plumb: the tenant snapshots and the (tenant_id, attachment) pairs."""
    tenants = [TenantNetworks.model_validate_json(r["snapshot"]) for r in
               await conn.fetch("SELECT snapshot FROM tenant_networks WHERE node_id=$1", node_id)]
    attachments = [(r["tenant_id"], SlotAttachment.model_validate_json(r["attachment"])) for r in
                   await conn.fetch("SELECT tenant_id, attachment FROM attachments WHERE node_id=$1", node_id)]
    return tenants, attachments
