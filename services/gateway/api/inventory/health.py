"""Node health (provider admins): read a node's health document and history, the fleet's states, the policy that
classifies alerts and the pools' automatic-cordon breakers, as the scheduler's health monitor published them
(``health_projection``); change the policy, drain or undrain a node and close a breaker, each a scheduler
command sent through the outbox (202: the views follow the scheduler's events)."""
from __future__ import annotations

import structlog
from aiohttp import web

from services.scheduler.contracts.health import CloseBreaker, DrainNode, HealthState, SetHealthPolicy

from ...adapters import inventory
from ...adapters.audit_state import StateReader, plain, select_object
from ...http.auth import require_provider_admin
from ...http.endpoint import Endpoint, Param, respond
from ...http.inputs import path_uuid, path_value, query_value, read_body
from ...http.params import NODE_ID
from ...http.problems import not_found
from ...http.schema_base import ShapeName
from ...http.state import gateway_of
from . import health_views as repo
from .health_schemas import (
    Breaker,
    BreakerCloseAccepted,
    Breakers,
    ConditionName,
    DrainAccepted,
    DrainRequest,
    FleetHealth,
    FleetNode,
    HealthHistoryEntry,
    HealthPolicy,
    HealthPolicyAccepted,
    HealthPolicyEntry,
    HealthPolicySet,
    NodeHealth,
)
from .node_schemas import NodeDetail
from .nodes import node_detail, send_update

log = structlog.get_logger()

CONDITION = Param("condition", "path", "The condition: a name, or xid:<number>, or xid:default (every XID without "
                  "a row of its own).", ConditionName, required=True)
POOL = Param("pool", "path", "The pool's name.", ShapeName, required=True)
STATE = Param("state", "query", "Only the nodes in this health state.", HealthState)


async def get_node_health(request: web.Request) -> web.Response:
    require_provider_admin(request)
    node_id = path_uuid(request, "node_id", "node")
    async with gateway_of(request).pool.acquire() as conn:
        doc = await repo.node_health(conn, node_id)
        if doc is None:
            raise not_found("node")
        history = await repo.history(conn, node_id)
    return respond(NodeHealth(**doc, history=[HealthHistoryEntry(**h) for h in history]))


async def fleet_health(request: web.Request) -> web.Response:
    require_provider_admin(request)
    state = query_value(request, STATE)
    async with gateway_of(request).pool.acquire() as conn:
        rows = await repo.fleet(conn, state)
    return respond(FleetHealth(items=[FleetNode(**r) for r in rows]))


async def get_policy(request: web.Request) -> web.Response:
    require_provider_admin(request)
    async with gateway_of(request).pool.acquire() as conn:
        rows = await repo.policy(conn)
    return respond(HealthPolicy(items=[HealthPolicyEntry(**r) for r in rows]))


async def set_policy(request: web.Request) -> web.Response:
    admin = require_provider_admin(request)
    condition = path_value(request, CONDITION)
    body = await read_body(request, HealthPolicySet)
    async with gateway_of(request).unit_of_work("gateway.set_health_policy") as uow:
        await uow.emit("scheduler.set_health_policy", SetHealthPolicy(
            condition=condition, classifications=body.classifications, note=body.note, requested_by=admin.user_id),
            correlation_id=f"health-policy:{condition}")
    log.info("audit.health_policy_requested", user_id=str(admin.user_id), condition=condition,
             classifications=body.classifications)
    return respond(HealthPolicyAccepted(condition=condition, classifications=body.classifications, note=body.note,
                                        requested_by=admin.user_id), 202)


async def drain_node(request: web.Request) -> web.Response:
    admin = require_provider_admin(request)
    node_id = path_uuid(request, "node_id", "node")
    body = await read_body(request, DrainRequest)
    async with gateway_of(request).unit_of_work("gateway.drain_node") as uow:
        if await inventory.get_node(uow.conn, node_id) is None:
            raise not_found("node")
        await uow.emit("scheduler.drain_node", DrainNode(
            node_id=node_id, mode=body.mode, deadline=body.deadline, reason=body.reason, requested_by=admin.user_id),
            correlation_id=str(node_id))
    log.info("audit.node_drain_requested", user_id=str(admin.user_id), node_id=str(node_id), mode=body.mode,
             deadline=body.deadline.isoformat() if body.deadline else None)
    return respond(DrainAccepted(node_id=node_id, mode=body.mode, deadline=body.deadline, reason=body.reason,
                                 requested_by=admin.user_id), 202)


async def undrain_node(request: web.Request) -> web.Response:
    """The uncordon: the scheduler ends the node's drain with its cordon."""
    admin = require_provider_admin(request)
    node_id = path_uuid(request, "node_id", "node")
    row = await send_update(gateway_of(request), node_id, {"cordoned": False}, admin.user_id)
    return respond(node_detail(row), 202)


async def list_breakers(request: web.Request) -> web.Response:
    require_provider_admin(request)
    async with gateway_of(request).pool.acquire() as conn:
        rows = await repo.breakers(conn)
    return respond(Breakers(items=[Breaker(**r) for r in rows]))


async def close_breaker(request: web.Request) -> web.Response:
    admin = require_provider_admin(request)
    pool = path_value(request, POOL)
    async with gateway_of(request).unit_of_work("gateway.close_breaker") as uow:
        if not await repo.pool_known(uow.conn, pool):
            raise not_found("pool")
        await uow.emit("scheduler.close_breaker", CloseBreaker(pool=pool, requested_by=admin.user_id),
                       correlation_id=f"pool:{pool}")
    log.info("audit.breaker_close_requested", user_id=str(admin.user_id), pool=pool)
    return respond(BreakerCloseAccepted(pool=pool, requested_by=admin.user_id), 202)


_POLICY_ROW = StateReader(select_object("health_policy_view", "condition = $1", "condition", "classifications",
                                        "note", "version"), plain("condition"))


ENDPOINTS = [
    Endpoint("GET", "/v1/nodes/{node_id}/health", get_node_health, "getNodeHealth",
             "Read a node's health and its history (provider admin)", "nodes", {200: NodeHealth},
             params=(NODE_ID,), errors=(401, 403, 404),
             description="As the scheduler's health monitor last published it: the state, the current alerts with "
                         "the classifications the policy gives them, whether health cordoned the node (and for "
                         "which condition), its drain and its pool's breaker; `history` is the last 100 changes, "
                         "newest first. A node never heard from is `unknown` (version 0)."),
    Endpoint("GET", "/v1/health/nodes", fleet_health, "listNodeHealth",
             "List every node's health state (provider admin)", "health", {200: FleetHealth}, params=(STATE,),
             errors=(401, 403, 422), description="Every node the gateway knows, by name, with its state and how "
                                                 "many alerts it has; `state` keeps the nodes in that state."),
    Endpoint("GET", "/v1/health/policy", get_policy, "getHealthPolicy",
             "Read how each health condition is classified (provider admin)", "health", {200: HealthPolicy},
             errors=(401, 403)),
    Endpoint("PUT", "/v1/health/policy/{condition}", set_policy, "setHealthPolicy",
             "Set how a health condition is classified (provider admin)", "health", {202: HealthPolicyAccepted},
             body=HealthPolicySet, params=(CONDITION,), errors=(400, 401, 403, 413, 415, 422),
             description="Sent to the scheduler (scheduler.set_health_policy); GET /v1/health/policy shows it once "
                         "applied, with a new version. The classifications replace the condition's: "
                         "`prevent_allocations` cordons the node, `drain` moves its allocations elsewhere, `fence` "
                         "destroys the instances left on it, `reset_gpu` and `replace` ask for a GPU reset or a "
                         "replacement. An empty list: the condition only alerts.",
             audit_state=_POLICY_ROW),
    Endpoint("POST", "/v1/nodes/{node_id}/drain", drain_node, "drainNode",
             "Drain a node: cordon it and move its allocations elsewhere (provider admin)", "nodes",
             {202: DrainAccepted}, body=DrainRequest, params=(NODE_ID,), errors=(400, 401, 403, 404, 413, 415, 422),
             description="Sent to the scheduler (scheduler.drain_node): `now` interrupts every allocation on the "
                         "node and reschedules it elsewhere; `deadline` lets allocations that end before the "
                         "deadline end, and moves the others then. Their tenants see allocation.interrupted and "
                         "allocation.rescheduled. GET /v1/nodes/{node_id}/health shows `draining`."),
    Endpoint("POST", "/v1/nodes/{node_id}/undrain", undrain_node, "undrainNode",
             "End a node's drain and cordon (provider admin)", "nodes", {202: NodeDetail}, params=(NODE_ID,),
             errors=(401, 403, 404),
             description="The uncordon (scheduler.update_node with cordoned false): new placements may use the "
                         "node again. Allocations already moved stay where they are."),
    Endpoint("GET", "/v1/health/breakers", list_breakers, "listHealthBreakers",
             "List the pools' automatic-cordon breakers (provider admin)", "health", {200: Breakers},
             errors=(401, 403),
             description="A pool's breaker opens when health cordons more than `share` of its nodes within "
                         "`window_s`; while it is open, health cordons nothing more in the pool."),
    Endpoint("POST", "/v1/health/breakers/{pool}/close", close_breaker, "closeHealthBreaker",
             "Close a pool's automatic-cordon breaker (provider admin)", "health", {202: BreakerCloseAccepted},
             params=(POOL,), errors=(401, 403, 404, 422),
             description="Sent to the scheduler (scheduler.close_breaker): health cordons in the pool again. 404 "
                         "for a pool the gateway does not know."),
]
