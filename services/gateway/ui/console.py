"""The allocation page's console tail: the last bytes of the instance's serial console, read from its node-agent
as GET /v1/allocations/{id}/console reads it (the tenant's own allocations only, ACTIVE ones; logged like the API's
read). The page fetches it after it has loaded, so a node that is slow to answer never holds the page."""
from __future__ import annotations

import uuid

import structlog
from aiohttp import web

from shared.rpc import RpcError, RpcNoResponders, RpcTimeout

from ..adapters import allocations
from ..api.allocations.console_views import NodeConsole
from ..domain.model import Principal
from ..http.problems import not_found
from ..http.state import gateway_of

log = structlog.get_logger()

TAIL_BYTES = 4096
TIMEOUT_S = 3.0


async def console_tail(request: web.Request, p: Principal) -> dict:
    """{"text": the tail or None, "why": why there is none}."""
    try:
        allocation_id = uuid.UUID(request.query.get("id", ""))
    except ValueError:
        raise not_found("allocation") from None
    gw = gateway_of(request)
    async with gw.pool.acquire() as conn:
        row = await allocations.get(conn, allocation_id, p.tenant_id)
    if row is None:
        raise not_found("allocation")
    if row["state"] != "ACTIVE" or row["node_id"] is None:
        return {"text": None, "why": "The console is shown while the allocation is ACTIVE."}
    console = NodeConsole(gw.rt.broker.connection, gw.rt.catalog, row["node_id"], row["id"], p.tenant_id,
                          min(gw.config.node_rpc_timeout_s, TIMEOUT_S))
    log.info("audit.console_read", user_id=str(p.user_id), tenant_id=str(p.tenant_id), allocation_id=str(row["id"]),
             node_id=str(row["node_id"]), tail=TAIL_BYTES, follow=False, via="dashboard")
    try:
        chunk = await console.read(-1, TAIL_BYTES)
    except (RpcNoResponders, RpcTimeout, RpcError) as exc:
        return {"text": None, "why": f"The node did not answer ({type(exc).__name__})."}
    if not chunk.found:
        return {"text": None, "why": "This allocation has no console on its node."}
    return {"text": chunk.text, "why": None}
