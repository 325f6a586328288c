"""An instance's serial console, read live from its node-agent (``node_agent.read_console``: core NATS
request/reply, answered by the agent on the allocation's node; nothing is stored or retried)."""
from __future__ import annotations

import uuid
from dataclasses import dataclass

from nats.aio.client import Client

from services.node_agent.contracts import ConsoleChunk, ReadConsole
from shared import rpc
from shared.contract import Catalog


@dataclass(frozen=True)
class NodeConsole:
    """The console of one allocation on one node, as a given tenant may read it."""

    nc: Client
    catalog: Catalog
    node_id: uuid.UUID
    allocation_id: uuid.UUID
    tenant_id: uuid.UUID
    timeout_s: float = 5.0

    async def read(self, offset: int, limit: int) -> ConsoleChunk:
        """``limit`` bytes from ``offset`` (-1: the last ``limit`` bytes). May wait ``timeout_s``; raises
        rpc.RpcNoResponders (no agent connected), rpc.RpcTimeout (no answer in time) or rpc.RpcError (the agent
        failed to read it)."""
        return await rpc.request(self.nc, self.catalog, "gateway", "node_agent.read_console", ReadConsole(
            allocation_id=self.allocation_id, tenant_id=self.tenant_id, offset=offset, limit=limit),
            timeout=self.timeout_s, node_id=str(self.node_id))
