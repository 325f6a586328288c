"""Power actions on an allocation's instance (reboot, stop, start): requested, listed, read.

A request is a privileged mutation: it is recorded (``instance_actions``, the audit record: who asked what
of which allocation on which node) and sent to the node (``node_agent.power``) in one unit of work, and
logged with the user id. The node answers with ``node_agent.power_changed`` (``power_projection``):
the action ends succeeded or failed, and the instance shows its new power state.

The command carries a deadline (``expires_at``: the request's time plus TESSERA_POWER_ACTION_TTL_S): a node
that gets it later refuses it, and an action no node answered by then (plus a grace) is failed by the
gateway's sweep (``entrypoints.loops``), so none stays pending for ever.

Another tenant's allocation, or a malformed id, is a 404; an action other than reboot, stop and start is a
422 naming ``action``.
"""
from __future__ import annotations

import uuid
from datetime import timedelta

import asyncpg
import structlog
from aiohttp import web

from services.node_agent.contracts import RequestPower
from shared.envelope import utcnow

from ...adapters import allocations as views
from ...domain.model import Principal
from ...http.auth import require_tenant_member
from ...http.endpoint import Endpoint, Param, respond
from ...http.inputs import path_uuid, path_value
from ...http.paging import CURSOR, LIMIT, Position, read_page
from ...http.params import ALLOCATION_ID
from ...http.policy import tags
from ...http.problems import ProblemError, not_found
from ...http.state import gateway_of
from . import power_views as repo
from .power_schemas import PowerAction, PowerActionOut, PowerActionPage

log = structlog.get_logger()
ACTION = Param("action", "path", "reboot, stop or start (anything else is a 422).", PowerAction, required=True)
# the same template as the POST's (OpenAPI holds /x/{a} and /x/{b} to be one path): here, an action's id
ACTION_ID = Param("action", "path", "The action's id (the `id` a power action answered with).", uuid.UUID, required=True)


def action_out(row: asyncpg.Record) -> PowerActionOut:
    base = f"/v1/allocations/{row['allocation_id']}"
    return PowerActionOut(**{k: row[k] for k in ("id", "allocation_id", "action", "state", "reason", "power_state",
                                                 "requested_at", "finished_at", "expires_at")},
                          requested_by=row["user_id"], links={"self": f"{base}/actions/{row['id']}", "allocation": base})


async def _tenant_allocation(conn: asyncpg.Connection, request: web.Request, p: Principal, *,
                             for_update: bool = False) -> asyncpg.Record:
    row = await views.get(conn, path_uuid(request, "allocation_id", "allocation"), p.tenant_id, for_update=for_update)
    if row is None:
        raise not_found("allocation")
    return row


def running_on_node(row: asyncpg.Record, what: str) -> uuid.UUID:
    """The node of an ACTIVE allocation; a 409 naming the state otherwise (or when it has no node)."""
    if row["state"] != "ACTIVE":
        raise ProblemError(409, f"the allocation is {row['state']}; {what} needs an ACTIVE allocation",
                           slug="allocation-not-active")
    return node_of(row)


def node_of(row: asyncpg.Record) -> uuid.UUID:
    if row["node_id"] is None:
        raise ProblemError(409, f"the allocation is {row['state']} and runs on no node yet", slug="no-node")
    return row["node_id"]


async def request_action(request: web.Request) -> web.Response:
    p = require_tenant_member(request)
    action = path_value(request, ACTION)
    gw, action_id = gateway_of(request), uuid.uuid4()
    expires_at = utcnow() + timedelta(seconds=gw.config.power_action_ttl_s)
    async with gw.unit_of_work("gateway.power_action") as uow:
        row = await _tenant_allocation(uow.conn, request, p, for_update=True)   # serialised with a release
        node_id = running_on_node(row, f"a {action}")
        act = await repo.insert_action(uow.conn, action_id, row["id"], p.tenant_id, p.user_id, node_id, action,
                                       expires_at)
        await uow.emit("node_agent.power", RequestPower(
            request_id=action_id, allocation_id=row["id"], tenant_id=p.tenant_id, node_id=node_id, action=action,
            requested_by=p.user_id, expires_at=expires_at), correlation_id=str(row["id"]), tenant_id=p.tenant_id,
            subject_params={"node_id": str(node_id)})
    log.info("audit.power_action_requested", user_id=str(p.user_id), tenant_id=str(p.tenant_id),
             allocation_id=str(row["id"]), node_id=str(node_id), action=action, action_id=str(action_id))
    out = action_out(act)
    return respond(out, 202, headers={"Location": out.links.self})


async def list_actions(request: web.Request) -> web.Response:
    p = require_tenant_member(request)

    async def actions(conn: asyncpg.Connection, n: int, after: Position | None) -> list:
        row = await _tenant_allocation(conn, request, p)
        return await repo.actions_page(conn, row["id"], n, after)
    items, next_cursor = await read_page(request, actions, created="requested_at")
    return respond(PowerActionPage(items=[action_out(r) for r in items], next_cursor=next_cursor))


async def get_action(request: web.Request) -> web.Response:
    p = require_tenant_member(request)
    async with gateway_of(request).pool.acquire() as conn:
        row = await _tenant_allocation(conn, request, p)
        act = await repo.get_action(conn, path_uuid(request, "action", "action"), row["id"])
    if act is None:
        raise not_found("action")
    return respond(action_out(act))


_BASE = "/v1/allocations/{allocation_id}/actions"
async def power_resource(request: web.Request, data: dict, _body) -> tuple[dict, dict]:
    """The policy resource of a power action: the allocation and the action."""
    return ({"allocation_id": request.match_info["allocation_id"], "action": request.match_info["action"]},
            tags(request, data))


ENDPOINTS = [
    Endpoint("POST", _BASE + "/{action}", request_action, "requestPowerAction",
             "Reboot, stop or start the allocation's instance", "allocations", {202: PowerActionOut},
             params=(ALLOCATION_ID, ACTION), errors=(401, 403, 404, 409, 422),
             headers={202: {"Location": "The action (/v1/allocations/{id}/actions/{action id})."}},
             description="The allocation must be ACTIVE (else a 409 naming its state). Accepted as `pending` and sent "
                         "to the allocation's node; the action then ends `succeeded` or `failed` (with the reason) "
                         "and the allocation's `instance.power_state` follows; the outcome is also an event of the "
                         "allocation's event stream (node_agent.power_changed). The node must act by `expires_at` "
                         "(TESSERA_POWER_ACTION_TTL_S after the request) or refuse; an action no node answered by "
                         "then (plus a grace) ends `failed`, naming the node and the deadline "
                         "(gateway.power_action_expired in the stream); should the node's answer still come, the "
                         "action shows it, its reason saying it came late. An action other than reboot, stop "
                         "or start is a 422 naming `action`. Each request is recorded with the caller's user id.",
             policy_resource=power_resource),
    Endpoint("GET", _BASE, list_actions, "listPowerActions", "List the power actions asked of the allocation, newest "
             "first", "allocations", {200: PowerActionPage}, params=(ALLOCATION_ID, LIMIT, CURSOR),
             errors=(401, 403, 404, 422)),
    Endpoint("GET", _BASE + "/{action}", get_action, "getPowerAction", "Read a power action", "allocations",
             {200: PowerActionOut}, params=(ALLOCATION_ID, ACTION_ID), errors=(401, 403, 404)),
]
