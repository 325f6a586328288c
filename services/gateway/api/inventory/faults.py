"""Fault injection (provider admins): inject a fault into a simulated node to exercise failure handling end to end
(the node's health, its cordon and drain, the interrupted allocations' reschedule), and read what the node did
with it (``node_agent.fault_injected``, projected by ``health_projection``).

Only a node whose driver simulates hardware (the sim driver, lab nodes) accepts a fault; a real node refuses it,
and the refusal shows on the fault (accepted false, with the node's reason)."""
from __future__ import annotations

import uuid

import structlog
from aiohttp import web

from services.node_agent.contracts import InjectFault

from ...adapters import inventory
from ...http.auth import require_provider_admin
from ...http.endpoint import Endpoint, Param, respond
from ...http.inputs import path_uuid, read_body
from ...http.params import NODE_ID
from ...http.problems import not_found
from ...http.state import gateway_of
from . import health_views as repo
from .health_schemas import Fault, FaultRequest

log = structlog.get_logger()

REQUEST_ID = Param("request_id", "path", "The fault's request_id (POST .../faults answered it).", uuid.UUID,
                   required=True)
SIMULATED_ONLY = ("Only for nodes whose driver simulates hardware (sim driver, lab nodes); a real node refuses it "
                  "(node_agent.fault_injected accepted=false).")


async def inject_fault(request: web.Request) -> web.Response:
    admin = require_provider_admin(request)
    node_id = path_uuid(request, "node_id", "node")
    body = await read_body(request, FaultRequest)
    request_id = uuid.uuid4()
    async with gateway_of(request).unit_of_work("gateway.inject_fault") as uow:
        if await inventory.get_node(uow.conn, node_id) is None:
            raise not_found("node")
        fault = body.model_dump()
        row = await repo.record_fault(uow.conn, request_id, node_id, fault, admin.user_id)
        await uow.emit("node_agent.inject_fault", InjectFault(node_id=node_id, request_id=request_id, **fault),
                       correlation_id=str(node_id), subject_params={"node_id": str(node_id)})
    log.info("audit.fault_injection_requested", user_id=str(admin.user_id), node_id=str(node_id), kind=body.kind,
             request_id=str(request_id))
    return respond(Fault(**row), 202)


async def get_fault(request: web.Request) -> web.Response:
    require_provider_admin(request)
    node_id = path_uuid(request, "node_id", "node")
    request_id = path_uuid(request, "request_id", "fault")
    async with gateway_of(request).pool.acquire() as conn:
        row = await repo.fault(conn, node_id, request_id)
    if row is None:
        raise not_found("fault")
    return respond(Fault(**row))


ENDPOINTS = [
    Endpoint("POST", "/v1/nodes/{node_id}/faults", inject_fault, "injectNodeFault",
             "Inject a fault into a simulated node (provider admin)", "nodes", {202: Fault}, body=FaultRequest,
             params=(NODE_ID,), errors=(400, 401, 403, 404, 413, 415, 422),
             description=f"{SIMULATED_ONLY} Sent to the node's agent (node_agent.inject_fault); the answer's "
                         "`request_id` names the fault, and GET /v1/nodes/{node_id}/faults/{request_id} shows "
                         "whether the node accepted it. An accepted fault shows as the node's alerts and health "
                         "(GET /v1/nodes/{node_id}/health) as a real one would; `clear` ends every injected fault."),
    Endpoint("GET", "/v1/nodes/{node_id}/faults/{request_id}", get_fault, "getNodeFault",
             "Read an injected fault and the node's answer (provider admin)", "nodes", {200: Fault},
             params=(NODE_ID, REQUEST_ID), errors=(401, 403, 404),
             description="`accepted` is null until the node answers; false with the node's `reason` when it "
                         "refused (a node whose driver does not simulate hardware refuses every fault)."),
]
