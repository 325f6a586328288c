"""Nodes (provider admins): ask the scheduler to register one; list what was asked and what it confirmed."""
from __future__ import annotations

import uuid

import asyncpg
from aiohttp import web

from services.scheduler.contracts import RegisterNode

from ..adapters import nodes
from ..auth import require_provider_admin
from ..endpoint import Endpoint, respond
from ..inputs import read_body
from ..problems import ProblemError
from ..schemas import NodeCreate, NodeList, NodeOut
from ..state import gateway_of


def node_out(row: asyncpg.Record) -> NodeOut:
    return NodeOut(**{**dict(row), "labels": nodes.labels_of(row)})


async def register_node(request: web.Request) -> web.Response:
    admin = require_provider_admin(request)
    body = await read_body(request, NodeCreate)
    gw, node_id = gateway_of(request), uuid.uuid4()
    async with gw.pool.acquire() as conn, conn.transaction():
        row = await nodes.request_node(conn, node_id, body.name, body.gpu_model, body.gpu_count, body.labels, admin.user_id)
        if row is None:
            raise ProblemError(409, f"a node named {body.name!r} already exists", slug="name-taken")
        # where the node is (pool, region, site, rack): only what was given, the scheduler defaults the rest
        location = body.model_dump(include={"pool", "region", "site", "rack"}, exclude_none=True)
        await gw.outbox.add(conn, "scheduler.register_node", RegisterNode(
            node_id=node_id, name=body.name, gpu_model=body.gpu_model, gpu_count=body.gpu_count, labels=body.labels,
            **location), correlation_id=str(node_id))
    return respond(node_out(row), 202)


async def list_nodes(request: web.Request) -> web.Response:
    require_provider_admin(request)
    async with gateway_of(request).pool.acquire() as conn:
        rows = await nodes.list_nodes(conn)
    return respond(NodeList(items=[node_out(r) for r in rows]))


ENDPOINTS = [
    Endpoint("POST", "/v1/nodes", register_node, "registerNode", "Register a node (provider admin)", "nodes",
             {202: NodeOut}, body=NodeCreate, errors=(400, 401, 403, 409, 413, 415, 422),
             description="Accepted as `registering`; the scheduler registers it and GET /v1/nodes then shows `registered`."),
    Endpoint("GET", "/v1/nodes", list_nodes, "listNodes", "List nodes (provider admin)", "nodes",
             {200: NodeList}, errors=(401, 403)),
]
