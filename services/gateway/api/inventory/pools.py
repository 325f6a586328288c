"""Node pools (provider admins): define one (a scheduler command sent through the outbox) and list them."""
from __future__ import annotations

from aiohttp import web

from services.scheduler.contracts import DefinePool

from ...adapters import inventory
from ...adapters.audit_state import StateReader, plain, select_object
from ...http.auth import require_provider_admin
from ...http.endpoint import Endpoint, Param, respond
from ...http.inputs import path_value, read_body
from ...http.schema_base import ShapeName
from ...http.state import gateway_of
from .pool_schemas import PoolDefinition, PoolList, PoolOut

POOL_NAME = Param("name", "path", "The pool's name (lower case, digits, '.' and '-').", ShapeName, required=True)


async def define_pool(request: web.Request) -> web.Response:
    require_provider_admin(request)
    name = path_value(request, POOL_NAME)
    body = await read_body(request, PoolDefinition)
    gw = gateway_of(request)
    async with gw.unit_of_work("gateway.define_pool") as uow:
        conn = uow.conn
        current = await inventory.get_pool(conn, name)
        await uow.emit("scheduler.define_pool", DefinePool(name=name, **body.model_dump()),
                            correlation_id=f"pool:{name}")
    version = current["version"] if current else None
    return respond(PoolOut(name=name, **body.model_dump(), version=version), 202)


async def list_pools(request: web.Request) -> web.Response:
    require_provider_admin(request)
    async with gateway_of(request).pool.acquire() as conn:
        rows = await inventory.pools(conn)
    return respond(PoolList(items=[PoolOut(**{k: r[k] for k in PoolOut.model_fields}) for r in rows]))


_POOL = StateReader(select_object("pools_view", "name = $1", "policy", "taints", "description", "version"),
                    plain("name"))


ENDPOINTS = [
    Endpoint("PUT", "/v1/pools/{name}", define_pool, "definePool", "Define a node pool (provider admin)", "pools",
             {202: PoolOut}, body=PoolDefinition, params=(POOL_NAME,), errors=(400, 401, 403, 413, 415, 422),
             audit_state=_POOL),
    Endpoint("GET", "/v1/pools", list_pools, "listPools", "List node pools (provider admin)", "pools",
             {200: PoolList}, errors=(401, 403)),
]
