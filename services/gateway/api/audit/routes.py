"""The audit trail's read side: GET /v1/audit (a filtered page), GET /v1/audit/export (the same filters as JSON
lines) and GET /v1/ops/audit/verify (recompute the chain).

Who sees what: provider admins every record; a tenant admin its tenant's (the records whose tenant_id is its
tenant: its members' requests and a provider admin's requests on a path naming the tenant); a tenant user
nothing (403). Each record is answered with its CADF and Kubernetes audit renderings (domain/audit.py).
"""
from __future__ import annotations

import json
import uuid
from typing import Literal

import structlog
from aiohttp import web

from shared import ledger_store

from ...domain.audit import cadf, k8s
from ...http.audit import AUDIT_TABLE
from ...http.auth import principal_of, require_provider_admin
from ...http.endpoint import NDJSON, Endpoint, Param, respond
from ...http.inputs import query_value
from ...http.paging import CURSOR, LIMIT, read_page
from ...http.problems import forbidden
from ...http.schema_base import Instant, text
from ...http.state import gateway_of
from . import views as repo
from .schemas import AuditPage, AuditRecord, AuditVerification
from .views import AuditFilter

log = structlog.get_logger()

SINCE = Param("from", "query", "Only records received at or after this time (RFC 3339).", Instant)
UNTIL = Param("to", "query", "Only records received before this time (RFC 3339).", Instant)
ACTION = Param("action", "query", "Only this operation (an operationId, e.g. setNodeBmc).", text(100, min_length=1))
TARGET_TYPE = Param("target_type", "query", "Only this target type (e.g. nodes.bmc).", text(100, min_length=1))
TARGET_ID = Param("target_id", "query", "Only this target id.", text(200, min_length=1))
USER_ID = Param("user_id", "query", "Only this actor.", uuid.UUID)
OUTCOME = Param("outcome", "query", "Only this outcome.", Literal["success", "failure", "unknown"])
FILTERS = (SINCE, UNTIL, ACTION, TARGET_TYPE, TARGET_ID, USER_ID, OUTCOME)


def _filter(request: web.Request) -> AuditFilter:
    """The query's filters, narrowed to the caller's tenant for a tenant admin; 403 for a tenant user."""
    p = principal_of(request)
    if not p.is_provider_admin and p.role != "tenant_admin":
        raise forbidden("the audit trail is for tenant admins and provider admins")
    v = {param.name: query_value(request, param) for param in FILTERS}
    return AuditFilter(tenant_id=None if p.is_provider_admin else p.tenant_id, since=v["from"], until=v["to"],
                       action=v["action"], target_type=v["target_type"], target_id=v["target_id"],
                       user_id=v["user_id"], outcome=v["outcome"])


def record_out(row) -> AuditRecord:
    values = dict(row)
    if isinstance(values["record"], str):   # no jsonb codec on the connection
        values["record"] = json.loads(values["record"])
    return AuditRecord(seq=row["seq"], audit_id=row["audit_id"], event_time=row["event_time"],
                       recorded_at=row["created_at"], tenant_id=row["tenant_id"], user_id=row["user_id"],
                       role=row["role"], action=row["action"], method=row["method"], path=row["path"],
                       target_type=row["target_type"], target_id=row["target_id"], outcome=row["outcome"],
                       status=row["status"], request_id=row["request_id"], record=values["record"],
                       row_hash=bytes(row["row_hash"]).hex(), cadf=cadf(values), k8s=k8s(values))


async def list_audit(request: web.Request) -> web.Response:
    f = _filter(request)
    items, next_cursor = await read_page(request, lambda conn, n, after: repo.page(conn, f, n, after),
                                         created="event_time")
    return respond(AuditPage(items=[record_out(r) for r in items], next_cursor=next_cursor))


async def export_audit(request: web.Request) -> web.StreamResponse:
    """Every matching record, oldest first, one JSON object a line; streamed from one snapshot."""
    f = _filter(request)
    resp = web.StreamResponse(headers={"Content-Type": NDJSON, "Cache-Control": "no-store"})
    async with gateway_of(request).pool.acquire() as conn, conn.transaction(isolation="repeatable_read",
                                                                            readonly=True):
        await resp.prepare(request)
        async for row in repo.stream(conn, f):
            await resp.write(record_out(row).model_dump_json().encode() + b"\n")
    await resp.write_eof()
    return resp


async def verify_audit(request: web.Request) -> web.Response:
    """Recompute every row hash, link and checkpoint of the audit chain (reads the whole table)."""
    p = require_provider_admin(request)
    async with gateway_of(request).pool.acquire() as conn:
        result = await ledger_store.verify(conn, AUDIT_TABLE)
    if not result.ok:
        log.error("audit.chain_broken", user_id=str(p.user_id), **{k: v for k, v in result.to_json().items()
                                                                   if k in ("bad_entry_count", "bad_entries")})
    return respond(AuditVerification(**result.to_json()))


_LIST_DOC = ("Filters combine (AND). Tenant admins see their tenant's records, provider admins all; tenant users "
             "are refused. Each record carries its CADF and Kubernetes audit renderings (docs/audit.md).")
ENDPOINTS = [
    Endpoint("GET", "/v1/audit", list_audit, "listAuditRecords", "Audit records of mutating requests, newest first",
             "audit", {200: AuditPage}, params=(*FILTERS, LIMIT, CURSOR), errors=(401, 403, 422),
             description=_LIST_DOC),
    Endpoint("GET", "/v1/audit/export", export_audit, "exportAuditRecords",
             "Every matching audit record as JSON lines, oldest first", "audit", {200: NDJSON}, params=FILTERS,
             errors=(401, 403, 422), description=_LIST_DOC),
    Endpoint("GET", "/v1/ops/audit/verify", verify_audit, "verifyAuditChain",
             "Recompute the audit chain's hashes and checkpoints (provider admin)", "ops", {200: AuditVerification},
             errors=(401, 403),
             description="Names the first altered, missing or reordered record (its seq) when the chain is broken."),
]
