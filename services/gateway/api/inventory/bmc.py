"""A node's BMC (provider admins): register or replace it, read it, remove it, and have the node's agent check it.

The password is write-only. It is sealed (AES-GCM, ``shared.secrets``) with the platform's key, bound to the
node (purpose ``bmc:<node id>``), before anything is stored or sent: node_bmcs and the ``node_agent.set_bmc``
command (written to the outbox in the same transaction) hold only the sealed value, which the node's agent
opens with the same key. It is never returned (``password_set`` says there is one) or logged. Without a
platform key (TESSERA_SECRET_KEY or TESSERA_SECRET_KEY_FILE) no BMC can be registered: 503.

Validation is a live read (``node_agent.validate_bmc``, request/reply): the report of a check that ran is a 200,
``ok`` true or false (a wrong password is ``ok: false``, ``error_kind: unauthorized``); a node whose agent is
not connected is a 503 at once (the bus has no responder), one whose agent does not answer in time a 504.
"""
from __future__ import annotations

import uuid

import asyncpg
import structlog
from aiohttp import web

from services.node_agent.contracts import Bmc, SetBmc
from shared.secrets import KEY_FILE_VAR, KEY_VAR, seal

from ...adapters.audit_state import StateReader, ids, select_object
from ...http.auth import require_provider_admin
from ...http.endpoint import Endpoint, respond
from ...http.inputs import path_uuid, read_body
from ...http.params import NODE_ID
from ...http.problems import ProblemError, not_found
from ...http.rpc_problems import answered
from ...http.state import Gateway, gateway_of
from . import bmc_views as repo
from . import node_views as nodes
from .bmc_schemas import BmcOut, BmcReport, BmcSet

log = structlog.get_logger()


def bmc_purpose(node_id: uuid.UUID) -> str:
    """What a node's sealed BMC password is bound to (the node-agent opens it with the same)."""
    return f"bmc:{node_id}"


def bmc_out(row: asyncpg.Record) -> BmcOut:
    return BmcOut(node_id=row["node_id"], url=row["url"], system_id=row["system_id"], username=row["username"],
                  verify_tls=row["verify_tls"], ca_bundle=row["ca_bundle"], password_set=True, version=row["version"],
                  updated_at=row["updated_at"], updated_by=row["set_by"])


def _key(gw: Gateway) -> bytes:
    if gw.secret_key is None:
        raise ProblemError(503, f"no platform secret key is configured ({KEY_VAR} or {KEY_FILE_VAR}): a BMC password "
                                "cannot be sealed, so no BMC can be registered", slug="no-secret-key")
    return gw.secret_key


async def set_bmc(request: web.Request) -> web.Response:
    admin = require_provider_admin(request)
    node_id = path_uuid(request, "node_id", "node")
    body = await read_body(request, BmcSet)
    gw = gateway_of(request)
    sealed = seal(body.password, _key(gw), bmc_purpose(node_id))
    bmc = Bmc(url=body.url, system_id=body.system_id, username=body.username, password_sealed=sealed,
              verify_tls=body.verify_tls, ca_bundle=body.ca_bundle)
    async with gw.unit_of_work("gateway.set_bmc") as uow:
        if not await nodes.exists(uow.conn, node_id, lock=True):
            raise not_found("node")
        row = await repo.put(uow.conn, node_id, bmc, admin.user_id)
        await uow.emit("node_agent.set_bmc", SetBmc(node_id=node_id, bmc=bmc, version=row["version"],
                                                    set_by=admin.user_id),
                       correlation_id=str(node_id), subject_params={"node_id": str(node_id)})
    log.info("audit.bmc_set", user_id=str(admin.user_id), node_id=str(node_id), url=body.url, version=row["version"])
    return respond(bmc_out(row))


async def get_bmc(request: web.Request) -> web.Response:
    require_provider_admin(request)
    node_id = path_uuid(request, "node_id", "node")
    async with gateway_of(request).pool.acquire() as conn:
        row = await repo.get(conn, node_id)
    if row is None:
        raise ProblemError(404, "no BMC is registered for this node (or no such node)")
    return respond(bmc_out(row))


async def delete_bmc(request: web.Request) -> web.Response:
    admin = require_provider_admin(request)
    node_id = path_uuid(request, "node_id", "node")
    async with gateway_of(request).unit_of_work("gateway.delete_bmc") as uow:
        version = await repo.remove(uow.conn, node_id, admin.user_id)
        if version is None:
            raise ProblemError(404, "no BMC is registered for this node (or no such node)")
        await uow.emit("node_agent.set_bmc", SetBmc(node_id=node_id, bmc=None, version=version, set_by=admin.user_id),
                       correlation_id=str(node_id), subject_params={"node_id": str(node_id)})
    log.info("audit.bmc_removed", user_id=str(admin.user_id), node_id=str(node_id), version=version)
    return web.Response(status=204)


async def validate_bmc(request: web.Request) -> web.Response:
    admin = require_provider_admin(request)
    node_id = path_uuid(request, "node_id", "node")
    gw = gateway_of(request)
    async with gw.pool.acquire() as conn:
        known = await nodes.exists(conn, node_id)
        row = await repo.get(conn, node_id) if known else None
    if not known:
        raise not_found("node")
    if row is None:
        raise ProblemError(409, "no BMC is registered for this node: PUT /v1/nodes/{node_id}/bmc first", slug="no-bmc")
    timeout = gw.config.bmc_validate_timeout_s
    with answered(f"the agent of node {node_id}", "node", "the BMC was not checked", "check the BMC", timeout_s=timeout):
        report = await repo.validate(gw.rt.broker.connection, gw.rt.catalog, node_id, repo.wire(row), timeout)
    log.info("audit.bmc_validated", user_id=str(admin.user_id), node_id=str(node_id), ok=report.ok,
             error_kind=report.error_kind)
    return respond(BmcReport(**report.model_dump()))


_PATH = "/v1/nodes/{node_id}/bmc"
_WRITE_ONLY = ("The password is write-only: sealed at rest (and on the bus to the node's agent) with the platform's "
               "secret key, bound to the node; it is never returned or logged.")
# validate first: a document-order client (the OpenAPI fuzz test) checks a node before it registers a BMC there
_BMC = StateReader(select_object("node_bmcs", "node_id = $1 AND url IS NOT NULL", "url", "system_id", "username",
                                 "verify_tls", "version", "set_by", "updated_at"), ids("node_id"))


ENDPOINTS = [
    Endpoint("POST", _PATH + "/validate", validate_bmc, "validateNodeBmc",
             "Check a node's BMC through its node-agent (provider admin)", "nodes", {200: BmcReport},
             params=(NODE_ID,), errors=(401, 403, 404, 409, 502, 503, 504),
             description="The node's agent reaches the BMC with the registered credentials and reads the system. "
                         "A check that ran answers 200 whatever it found: `ok: false` with `error_kind` "
                         "(`unauthorized` for a wrong password, `unreachable`, `timeout`, ...). No BMC registered: "
                         "409 `no-bmc`; the node's agent is not connected: 503 at once (with Retry-After); it did "
                         "not answer in time (TESSERA_BMC_VALIDATE_TIMEOUT_S): 504; it failed: 502."),
    Endpoint("GET", _PATH, get_bmc, "getNodeBmc", "Read a node's BMC, without its password (provider admin)", "nodes",
             {200: BmcOut}, params=(NODE_ID,), errors=(401, 403, 404),
             description="404 when the node has no BMC registered. " + _WRITE_ONLY),
    Endpoint("PUT", _PATH, set_bmc, "setNodeBmc", "Register or replace a node's BMC (provider admin)", "nodes",
             {200: BmcOut}, body=BmcSet, params=(NODE_ID,), errors=(400, 401, 403, 404, 413, 415, 422, 503),
             description="Bare metal through Redfish: the node's agent drives the node through this BMC. "
                         + _WRITE_ONLY + " The registration reaches the node's agent as node_agent.set_bmc (the "
                         "highest `version` wins). Without a platform key (TESSERA_SECRET_KEY or "
                         "TESSERA_SECRET_KEY_FILE) it is a 503 `no-secret-key`. An unknown node is a 404.",
             audit_state=_BMC),
    Endpoint("DELETE", _PATH, delete_bmc, "deleteNodeBmc", "Remove a node's BMC (provider admin)", "nodes",
             {204: None}, params=(NODE_ID,), errors=(401, 403, 404),
             description="The node's agent forgets it (node_agent.set_bmc without a BMC). 404 when none is registered.",
             audit_state=_BMC),
]
