"""The network service driven over the bus as the gateway and the saga drive it, and its answers read back."""
from __future__ import annotations

import uuid

from tests.support.bus import send_command as send
from tests.support.commands import attach_cmd, detach_cmd


class Net:
    """Drives the network service over the bus and reads its answers."""

    def __init__(self, rt, js, events):
        self.rt, self.js, self.events = rt, js, events

    async def result(self, sent_env, side=("network.tenant_networks_changed",)) -> dict:
        """The one result event of a command (matched by causation), leaving out the ``side`` events it also caused."""
        [hit] = await self.events.wait_for(lambda i: i[1].get("causation_id") == str(sent_env.id)
                                           and i[1]["type"] not in side)
        return hit[1]

    async def command(self, type_: str, data: dict) -> dict:
        env, _ = await send(self.js, type_, data)
        return await self.result(env)

    async def create(self, tenant: uuid.UUID, name: str, cidr: str, network_id: uuid.UUID | None = None) -> dict:
        return await self.command("network.create_network", {"network_id": network_id or uuid.uuid4(),
                                                              "tenant_id": tenant, "name": name, "cidr": cidr})

    async def attach(self, tenant: uuid.UUID, network_id: uuid.UUID | None, alloc: uuid.UUID | None = None,
                     node: uuid.UUID | None = None, ip_address: str | None = None) -> dict:
        cmd = {**attach_cmd(alloc or uuid.uuid4(), tenant), "network_id": network_id, "ip_address": ip_address}
        if node:
            cmd["node_id"] = node
        env, _ = await send(self.js, "network.attach_network", cmd)
        return await self.result(env, ("network.tenant_networks_changed", "network.network_created"))

    async def detach(self, tenant: uuid.UUID, alloc: uuid.UUID) -> dict:
        env, _ = await send(self.js, "network.detach_network", detach_cmd(alloc, tenant, uuid.uuid4()))
        return await self.result(env)

    async def snapshot_after(self, tenant: uuid.UUID, version: int) -> dict:
        [hit] = await self.events.wait_for(lambda i: i[1]["type"] == "network.tenant_networks_changed"
                                           and i[1]["data"]["tenant_id"] == str(tenant)
                                           and i[1]["data"]["version"] == version)
        return hit[1]["data"]

    async def fetch(self, sql: str, *args):
        async with self.rt.pool.acquire() as conn:
            return await conn.fetch(sql, *args)

    async def leases(self, owner: uuid.UUID) -> dict[str, int]:
        return {r["pool"]: r["value"] for r in await self.fetch("SELECT pool, value FROM pool_leases WHERE owner=$1", owner)}
