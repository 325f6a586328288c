"""Nodes (provider admins): ask the scheduler to register one; list what was asked and what it confirmed; read a
node's whole document, approve its slot map, change it, cordon it and run its burn-in again. Every write is a
scheduler command sent through the outbox; the views follow its events."""
from __future__ import annotations

import uuid

import asyncpg
import structlog
from aiohttp import web

from services.scheduler.contracts import ApproveSlotMap, RegisterNode, RunBurnInRequest, UpdateNode

from ...adapters import inventory
from ...adapters.audit_state import StateReader, ids, select_object
from ...http.auth import require_provider_admin
from ...http.endpoint import Endpoint, respond
from ...http.inputs import path_uuid, read_body
from ...http.params import NODE_ID
from ...http.problems import ProblemError, not_found
from ...http.state import Gateway, gateway_of
from . import node_views as nodes
from .node_schemas import (
    BurnIn,
    NodeCreate,
    NodeDetail,
    NodeList,
    NodeOut,
    NodePatch,
    ProposalProblem,
    QuarantinedSlot,
    SlotMapApproval,
)

log = structlog.get_logger()
_WRITE_ERRORS = (400, 401, 403, 404, 413, 415, 422)


class ProposalConflict(ProblemError):
    """409 naming the node's current proposal and status (extension members of the problem)."""

    def __init__(self, detail: str, current: int | None, status: str):
        super().__init__(409, detail, slug="proposal-conflict")
        self.current, self.node_status = current, status

    def to_problem(self, instance: str | None = None) -> ProposalProblem:
        base = super().to_problem(instance).model_dump()
        return ProposalProblem(**base, current_proposal=self.current, node_status=self.node_status)


def node_out(row: asyncpg.Record) -> NodeOut:
    return NodeOut(**{**dict(row), "labels": nodes.labels_of(row)})


def node_detail(row: dict) -> NodeDetail:
    """The document as this API shows it (of the scheduler's quarantine and burn-in records, the members it names)."""
    quarantined = [{k: q[k] for k in QuarantinedSlot.model_fields if k in q} for q in row.get("quarantined") or []]
    burn_in = BurnIn.shown(row["burn_in"]) if row.get("burn_in") else None
    return NodeDetail(**{**row, "quarantined": quarantined, "burn_in": burn_in})


async def register_node(request: web.Request) -> web.Response:
    admin = require_provider_admin(request)
    body = await read_body(request, NodeCreate)
    gw, node_id = gateway_of(request), uuid.uuid4()
    async with gw.unit_of_work("gateway.register_node") as uow:
        conn = uow.conn
        row = await nodes.request_node(conn, node_id, body.name, body.gpu_model, body.gpu_count, body.labels, admin.user_id)
        if row is None:
            raise ProblemError(409, f"a node named {body.name!r} already exists", slug="name-taken")
        # where the node is (pool, region, site, rack): only what was given, the scheduler defaults the rest
        location = body.model_dump(include={"pool", "region", "site", "rack"}, exclude_none=True)
        await uow.emit("scheduler.register_node", RegisterNode(
            node_id=node_id, name=body.name, gpu_model=body.gpu_model, gpu_count=body.gpu_count, labels=body.labels,
            **location), correlation_id=str(node_id))
    return respond(node_out(row), 202)


async def list_nodes(request: web.Request) -> web.Response:
    require_provider_admin(request)
    async with gateway_of(request).pool.acquire() as conn:
        rows = await nodes.list_nodes(conn)
    return respond(NodeList(items=[node_out(r) for r in rows]))


async def get_node(request: web.Request) -> web.Response:
    require_provider_admin(request)
    node_id = path_uuid(request, "node_id", "node")
    async with gateway_of(request).pool.acquire() as conn:
        row = await inventory.get_node(conn, node_id)
    if row is None:
        raise not_found("node")
    return respond(node_detail(row))


AWAITING_APPROVAL = ("pending_approval", "needs_review")


async def approve_slot_map(request: web.Request) -> web.Response:
    """202 and one approve_slot_map when the view shows the node awaiting approval of exactly this proposal:
    a new node (``pending_approval``) or one whose re-discovery differs from its approved map (``needs_review``)."""
    admin = require_provider_admin(request)
    node_id = path_uuid(request, "node_id", "node")
    body = await read_body(request, SlotMapApproval)
    gw = gateway_of(request)
    async with gw.unit_of_work("gateway.approve_slot_map") as uow:
        conn = uow.conn
        row = await inventory.get_node(conn, node_id, for_update=True)
        if row is None:
            raise not_found("node")
        if row["status"] not in AWAITING_APPROVAL:
            raise ProposalConflict(f"the node is {row['status']}, not awaiting approval (pending_approval or needs_review)",
                                   row["proposal"], row["status"])
        if row["proposal"] != body.proposal:
            raise ProposalConflict(f"proposal {body.proposal} is not the node's current proposal {row['proposal']}",
                                   row["proposal"], row["status"])
        await uow.emit("scheduler.approve_slot_map", ApproveSlotMap(
            node_id=node_id, proposal=body.proposal, approved_by=admin.user_id, wipe_policy=body.wipe_policy),
            correlation_id=str(node_id))
    return respond(node_detail(row), 202)


async def send_update(gw: Gateway, node_id: uuid.UUID, changes: dict, requested_by: uuid.UUID) -> dict:
    """Send one update_node; returns the node document with the requested changes (as requested). 404 for a
    node the view does not know."""
    async with gw.unit_of_work("gateway._update") as uow:
        conn = uow.conn
        row = await inventory.get_node(conn, node_id)
        if row is None:
            raise not_found("node")
        await uow.emit("scheduler.update_node", UpdateNode(node_id=node_id, requested_by=requested_by, **changes),
                       correlation_id=str(node_id))
    return {**row, **{k: v for k, v in changes.items() if k != "reason"}}


async def patch_node(request: web.Request) -> web.Response:
    admin = require_provider_admin(request)
    node_id = path_uuid(request, "node_id", "node")
    body = await read_body(request, NodePatch)     # one change at least, none of them null (the model says so)
    changes = body.model_dump(exclude_unset=True)
    row = await send_update(gateway_of(request), node_id, changes, admin.user_id)
    return respond(node_detail(row), 202)


def _cordon(value: bool):
    async def handler(request: web.Request) -> web.Response:
        admin = require_provider_admin(request)
        node_id = path_uuid(request, "node_id", "node")
        row = await send_update(gateway_of(request), node_id, {"cordoned": value}, admin.user_id)
        return respond(node_detail(row), 202)
    return handler


BURN_IN_FROM = ("schedulable", "burn_in", "burn_in_failed")   # the scheduler's rule: an approved node, in these


async def run_burn_in(request: web.Request) -> web.Response:
    """202 and one scheduler.run_burn_in for an approved node the view shows schedulable, burning in or failed
    burn-in; a 409 naming its status otherwise. The scheduler refuses it while allocations hold the node's slots
    (the refusal shows in ``last_rejection``)."""
    admin = require_provider_admin(request)
    node_id = path_uuid(request, "node_id", "node")
    async with gateway_of(request).unit_of_work("gateway.run_burn_in") as uow:
        row = await inventory.get_node(uow.conn, node_id)
        if row is None:
            raise not_found("node")
        if row["status"] not in BURN_IN_FROM or row["approved_slot_map"] is None:
            raise ProblemError(409, f"the node is {row['status']}: a burn-in runs on an approved node "
                                    f"({', '.join(BURN_IN_FROM)})", slug="burn-in-not-allowed")
        await uow.emit("scheduler.run_burn_in", RunBurnInRequest(node_id=node_id, requested_by=admin.user_id),
                       correlation_id=str(node_id))
    log.info("audit.burn_in_requested", user_id=str(admin.user_id), node_id=str(node_id))
    return respond(node_detail(row), 202)


_NODE = StateReader(select_object("nodes_view", "id = $1", "name", "status", "cordoned", "labels", "taints", "pool",
                                  "region", "site", "rack", "gpu_model", "gpu_count", "quarantined", "version"),
                    ids("node_id"))


ENDPOINTS = [
    Endpoint("POST", "/v1/nodes", register_node, "registerNode", "Register a node (provider admin)", "nodes",
             {202: NodeOut}, body=NodeCreate, errors=(400, 401, 403, 409, 413, 415, 422),
             description="Accepted as `registering`; the scheduler registers it and GET /v1/nodes then shows `registered`."),
    Endpoint("GET", "/v1/nodes", list_nodes, "listNodes", "List nodes (provider admin)", "nodes",
             {200: NodeList}, errors=(401, 403)),
    Endpoint("GET", "/v1/nodes/{node_id}", get_node, "getNode", "Read a node's whole document (provider admin)", "nodes",
             {200: NodeDetail}, params=(NODE_ID,), errors=(401, 403, 404),
             description="Includes the proposed slot map and the proposal number to approve, and the scheduler's "
                         "last refusal of a command about the node."),
    Endpoint("POST", "/v1/nodes/{node_id}/approve", approve_slot_map, "approveSlotMap",
             "Approve a node's proposed slot map (provider admin)", "nodes", {202: NodeDetail}, body=SlotMapApproval,
             params=(NODE_ID,), errors=(*_WRITE_ERRORS, 409), problems={409: (ProposalProblem,)},
             description="409 (with current_proposal and node_status) when the node is not pending approval of "
                         "this proposal."),
    Endpoint("PATCH", "/v1/nodes/{node_id}", patch_node, "updateNode",
             "Change a node's pool, labels, taints or cordon (provider admin)", "nodes", {202: NodeDetail},
             body=NodePatch, params=(NODE_ID,), errors=_WRITE_ERRORS,
             description="The answer shows the document as requested; GET shows it once the scheduler applied it.",
             audit_state=_NODE),
    Endpoint("POST", "/v1/nodes/{node_id}/cordon", _cordon(True), "cordonNode",
             "Cordon a node: no new placements (provider admin)", "nodes", {202: NodeDetail}, params=(NODE_ID,),
             errors=(401, 403, 404), description="Running allocations stay."),
    Endpoint("POST", "/v1/nodes/{node_id}/uncordon", _cordon(False), "uncordonNode",
             "Uncordon a node (provider admin)", "nodes", {202: NodeDetail}, params=(NODE_ID,), errors=(401, 403, 404)),
    Endpoint("POST", "/v1/nodes/{node_id}/burn-in", run_burn_in, "runNodeBurnIn",
             "Run a node's burn-in again (provider admin)", "nodes", {202: NodeDetail}, params=(NODE_ID,),
             errors=(401, 403, 404, 409),
             description="The node leaves service (`burn_in`) while its agent runs the checks; a pass makes it "
                         "`schedulable`, a failure `burn_in_failed` with the failed checks in `review` (`burn_in` "
                         "shows the run). Only an approved node that is schedulable, burning in or failed burn-in "
                         "(else 409 naming its status); the scheduler refuses it while allocations run on the node "
                         "(drain it first), shown in `last_rejection`."),
]
