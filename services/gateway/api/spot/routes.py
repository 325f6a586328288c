"""The provider's spot offerings (provider admins): enable or change one per pool (PUT), disable it (DELETE: every
spot node taken back with notice; the offering stays listed, disabled), list them, read one.

A PUT or DELETE is accepted with 202 and travels to the paas service as ``paas.set_spot_offering`` through the outbox; the
read model shows the service's newest document (``projection``). Refused up front, nothing sent: a pool that is
neither defined nor holds a node (404), an unknown shape (422), a tenant that does not exist (422); a DELETE of a
pool with no offering (404). The spot market
is reached through a recording driver (``driver: recording``): its calls are rendered and recorded, no market is
contacted.
"""
from __future__ import annotations

from aiohttp import web

from services.paas.contracts import SetSpotOffering

from ...adapters import spot as repo
from ...adapters.audit_state import StateReader, plain, select_object
from ...adapters.catalog import resolve_shape
from ...adapters.identity import tenant_exists
from ...http.auth import require_provider_admin
from ...http.endpoint import Endpoint, Param, respond
from ...http.inputs import path_value, read_body
from ...http.problems import not_found, validation_problem
from ...http.schema_base import FieldError, ShapeName
from ...http.state import gateway_of
from .schemas import SpotOfferingAccepted, SpotOfferingList, SpotOfferingOut, SpotOfferingSet

POOL = Param("pool", "path", "The pool's name.", ShapeName, required=True)


def _links(pool: str) -> dict[str, str]:
    return {"self": f"/v1/spot-offerings/{pool}"}


async def set_spot_offering(request: web.Request) -> web.Response:
    p = require_provider_admin(request)
    pool = path_value(request, POOL)
    body = await read_body(request, SpotOfferingSet)
    gw = gateway_of(request)
    async with gw.unit_of_work("gateway.set_spot_offering") as uow:
        conn = uow.conn
        if not await repo.pool_known(conn, pool):
            raise not_found("pool")
        current = await repo.offering(conn, pool)
        shape = await resolve_shape(conn, body.shape)
        if not await tenant_exists(conn, body.tenant_id):
            raise validation_problem([FieldError(field="tenant_id", message="no such tenant", code="unknown_tenant")],
                                     "the spot tenant does not exist")
        await uow.emit("paas.set_spot_offering", SetSpotOffering(
            pool=pool, enabled=True, tenant_id=body.tenant_id, user_id=p.user_id, shape=shape.name,
            gpu_count=shape.gpu_count, gpu_model=shape.gpu_model, max_nodes=body.max_nodes,
            headroom_gpus=body.headroom_gpus, notice_s=body.notice_s, tolerations=body.tolerations, group=body.group,
            region=body.region, cluster_name=body.cluster_name or f"tessera-{pool}"[:31],
            requested_by=str(p.user_id)), correlation_id=f"spot:{pool}")
    return respond(SpotOfferingAccepted(pool=pool, enabled=True, requested=body, current=current,
                                        links=_links(pool)), 202)


async def disable_spot_offering(request: web.Request) -> web.Response:
    p = require_provider_admin(request)
    pool = path_value(request, POOL)
    gw = gateway_of(request)
    async with gw.unit_of_work("gateway.disable_spot_offering") as uow:
        current = await repo.offering(uow.conn, pool)
        if current is None:
            raise not_found("spot offering")
        await uow.emit("paas.set_spot_offering", SetSpotOffering(
            pool=pool, enabled=False, tenant_id=current["tenant_id"], user_id=p.user_id, shape=current["shape"],
            gpu_count=current["gpu_count"], cluster_name=current["cluster_name"], requested_by=str(p.user_id)),
            correlation_id=f"spot:{pool}")
    return respond(SpotOfferingAccepted(pool=pool, enabled=False, current=current, links=_links(pool)), 202)


async def list_spot_offerings(request: web.Request) -> web.Response:
    require_provider_admin(request)
    async with gateway_of(request).pool.acquire() as conn:
        docs = await repo.offerings(conn)
    return respond(SpotOfferingList(items=docs))


async def get_spot_offering(request: web.Request) -> web.Response:
    require_provider_admin(request)
    pool = path_value(request, POOL)
    async with gateway_of(request).pool.acquire() as conn:
        doc = await repo.offering(conn, pool)
    if doc is None:
        raise not_found("spot offering")
    return respond(SpotOfferingOut(**doc))


_STATE = StateReader(select_object("spot_offerings_view", "pool = $1", "doc", "version"), plain("pool"))

ENDPOINTS = [
    Endpoint("PUT", "/v1/spot-offerings/{pool}", set_spot_offering, "setSpotOffering",
             "Enable, change or disable a pool's spot offering (provider admin)", "spot", {202: SpotOfferingAccepted},
             body=SpotOfferingSet, params=(POOL,), errors=(400, 401, 403, 404, 413, 415, 422), audit_state=_STATE),
    Endpoint("DELETE", "/v1/spot-offerings/{pool}", disable_spot_offering, "disableSpotOffering",
             "Disable a pool's spot offering: every spot node taken back with notice (provider admin)", "spot",
             {202: SpotOfferingAccepted}, params=(POOL,), errors=(401, 403, 404, 422), audit_state=_STATE),
    Endpoint("GET", "/v1/spot-offerings", list_spot_offerings, "listSpotOfferings",
             "List spot offerings (provider admin)", "spot", {200: SpotOfferingList}, errors=(401, 403)),
    Endpoint("GET", "/v1/spot-offerings/{pool}", get_spot_offering, "getSpotOffering",
             "Read a pool's spot offering (provider admin)", "spot", {200: SpotOfferingOut}, params=(POOL,),
             errors=(401, 403, 404, 422)),
]
