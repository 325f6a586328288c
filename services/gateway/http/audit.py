"""The audit middleware: every POST, PUT, PATCH and DELETE on a declared route leaves one chained audit_log row,
and so does each privileged read (domain.audit.AUDITED_READS: a console read, the audit and FOCUS exports).

Where it sits: inside the telemetry middleware (so the record carries the request's trace id) and outside the
problems middleware (so it sees the final status and problem type of every refusal, the auth middleware's 401s
included). The row is appended after the handler ran, in its own transaction (shared.ledger_store.append_many: the
table's advisory lock, one INSERT; shared with the records of concurrent requests, http/audit_writer.py), so a
handler's own transaction never waits on the audit lock.

What is recorded for whom:
  * an authenticated caller: its user id, role, tenant and (when its token says) API key id;
  * POST /v1/auth/token: the user the key belongs to on success; on failure an anonymous actor with the
    presented key's id (a fingerprint of its hash, never the key), so failed key guesses are on record;
  * an unauthenticated request to a mutating route (401): an anonymous actor (user id null, role null) with the
    source address and user agent, outcome failure, the problem type .../unauthorized. Requests matching no
    declared route (404/405 from the router) have no operationId and change nothing: they are not recorded
    (they are in the access log), so anyone cannot fill the chain with junk paths.

Failure to write (fail closed): the handler has already committed, so nothing can be rolled back; but a client
must never see a success that left no trace. The record is logged at error level in full (redacted, as stored;
the log is the place to recover it from), ``tessera_audit_write_failures_total`` counts it, and the answer is a
500 problem (type .../audit-failed) saying the change may have been made and was not audited. An operator alert
on the counter is the intended follow-up; nothing is spooled for a later retry (a spool on the gateway's disk
would be neither chained nor durable across replicas). A streamed answer (a followed console, an export) has been
sent by then: its failure is logged and counted only.

Before and after: a PUT, PATCH or DELETE whose operation has a state reader (its Endpoint's ``audit_state``,
gathered by entrypoints/http.py and given to ``audit_middleware``: all of them, a test says so) reads the target's
state just before the handler runs and just after it returns, each on its own pooled connection (none is held
while the handler runs), and a success (2xx) records them as
``change: {before, after}``, redacted like a body. A refused request records no state: a caller refused for
another tenant's object must not find that object's state in a record. The before-read runs ahead of the auth
middleware, so a reader that needs the caller (an SSH key is its owner's) gets the bearer token's principal,
verified here as the auth middleware will; a record is only kept for a success, which that middleware accepted.
Reading never fails a request: a read that raises is logged and recorded as ``change: {error: <type>}``.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from datetime import UTC, datetime

import structlog
from aiohttp import web
from opentelemetry import trace
from prometheus_client import Counter

from ..domain.audit import (
    AUDITED_METHODS,
    AUDITED_READS,
    BODY_METHODS,
    CHANGE_METHODS,
    MAX_AGENT,
    OBSERVER,
    bounded_body,
    change_failed,
    change_of,
    outcome_of,
    storable,
    target_of,
    tenant_of,
)
from .audit_writer import AuditWriter
from .auth import API_KEY_ID, PRINCIPAL, credentials
from .endpoint import AuditState
from .inputs import JSON_BODY
from .problems import PROBLEM_JSON, ProblemError, problem_response
from .state import gateway_of

log = structlog.get_logger()
AUDIT_TABLE = "audit_log"
FAILURES = Counter("tessera_audit_write_failures_total", "Mutating requests whose audit record could not be written")
_MAX_PARSED = 256 * 1024   # response bodies read for the created id / problem type


def _request_id() -> tuple[str, str | None]:
    """The current span's trace id and span id (hex); a random id when tracing is off."""
    ctx = trace.get_current_span().get_span_context()
    if ctx.is_valid:
        return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")
    return uuid.uuid4().hex, None


def _json_of(resp: web.StreamResponse | None) -> dict | None:
    if not isinstance(resp, web.Response) or resp.content_type not in ("application/json", PROBLEM_JSON):
        return None
    body = resp.body
    if not isinstance(body, (bytes, bytearray)) or len(body) > _MAX_PARSED:
        return None
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def build_entry(request: web.Request, resp: web.StreamResponse | None, status: int, received: datetime,
                started: float, change: dict | None = None) -> dict:
    """The audit_log row (without seq and hashes) for ``request`` answered with ``status``; ``change`` (a
    success's before and after, see the module docstring) is kept when given."""
    route = request.match_info.route
    params = {k: storable(v) for k, v in request.match_info.items()}
    path = storable(request.path)
    doc = _json_of(resp) or {}
    principal = request.get(PRINCIPAL)
    created = doc.get("id") if status < 400 and isinstance(doc.get("id"), str) else None
    target = target_of(route.resource.canonical, params, request.method, status, created)
    tenant = tenant_of(principal.tenant_id if principal else None, params)
    trace_id, span_id = _request_id()
    reason = doc.get("type") if status >= 400 and isinstance(doc.get("type"), str) else None
    body = bounded_body(request.get(JSON_BODY)) if request.method in BODY_METHODS else None
    record = {
        "stage": "ResponseComplete", "level": "Request" if body is not None else "Metadata",
        "actor": {"type": "user" if principal else "anonymous",
                  "id": str(principal.user_id) if principal else None,
                  "role": principal.role if principal else None,
                  "tenant_id": str(principal.tenant_id) if principal and principal.tenant_id else None,
                  "api_key_id": request.get(API_KEY_ID) or (principal.api_key_id if principal else None),
                  "ip": request.remote, "user_agent": storable(request.headers.get("User-Agent", "")[:MAX_AGENT])},
        "target": {"type": target.type, "id": target.id, "params": target.params,
                   "tenant_id": str(tenant) if tenant else None},
        "outcome": {"result": outcome_of(status), "code": status, "reason": reason},
        "request": {"method": request.method, "path": path, "span_id": span_id,
                    "body_bytes": request.content_length, "body": body},
        "observer": OBSERVER,
        "duration_us": int((time.perf_counter() - started) * 1_000_000),
    }
    if change is not None:
        record["change"], record["level"] = change, "RequestResponse"
    return {"audit_id": uuid.uuid4(), "event_time": received, "tenant_id": tenant,
            "user_id": principal.user_id if principal else None, "role": principal.role if principal else None,
            "action": route.name, "method": request.method, "path": path, "target_type": target.type,
            "target_id": target.id, "outcome": outcome_of(status), "status": status, "request_id": trace_id,
            "record": record}


async def write(request: web.Request, entry: dict) -> None:
    """Append ``entry`` to the chain, group-committed with the records of concurrent requests (http/audit_writer.py);
    returns once it is committed. Raises whatever the database raises."""
    gw = gateway_of(request)
    if gw.audit_writer is None:
        gw.audit_writer = AuditWriter(lambda: gw.pool, AUDIT_TABLE)
    await gw.audit_writer.append(entry)


def _audited(request: web.Request) -> bool:
    route = request.match_info.route
    return (route.name is not None and route.resource is not None
            and (request.method in AUDITED_METHODS or route.name in AUDITED_READS))


def _state_reader(request: web.Request, readers: dict[str, AuditState]) -> AuditState | None:
    return readers.get(request.match_info.route.name) if request.method in CHANGE_METHODS else None


def _caller(request: web.Request):
    """The principal: the auth middleware's, or (before it ran) the bearer token's; None when there is none."""
    principal = request.get(PRINCIPAL)
    if principal is not None:
        return principal
    try:
        return gateway_of(request).tokens.verify(credentials(request, "Bearer"))
    except ProblemError:
        return None


async def _read_state(request: web.Request, reader) -> tuple[dict | None, BaseException | None]:
    """The target's state now, or the error that kept it from being read (logged; never raised). Nothing is read
    for a caller without a valid token: every update route needs one, so the request is a 401 and keeps no state
    (and an anonymous flood costs no query)."""
    try:
        caller = _caller(request)
        if caller is None:
            return None, None
        async with gateway_of(request).pool.acquire() as conn:
            return await reader(conn, dict(request.match_info), caller), None
    except Exception as exc:
        log.warning("audit.state_unreadable", operation=request.match_info.route.name, error=type(exc).__name__,
                    exc_info=True)
        return None, exc


async def _change(request: web.Request, reader, before: tuple, status: int) -> dict | None:
    """A success's ``change`` member; None for a refusal or an operation without a reader."""
    if reader is None or not 200 <= status < 300:
        return None
    after = await _read_state(request, reader)
    failed = before[1] or after[1]
    return change_failed(failed) if failed else change_of(before[0], after[0])


async def _record(request: web.Request, resp, status: int, received: datetime, started: float,
                  change: dict | None = None) -> bool:
    """Write the record; False (after logging it loudly) when it could not be written."""
    entry = None
    try:
        entry = build_entry(request, resp, status, received, started, change)
        await write(request, entry)
        return True
    except Exception:
        FAILURES.inc()
        log.exception("audit.write_failed", method=request.method, path=request.path, status=status,
                      record=json.dumps(entry, default=str) if entry else None)
        return False


def audit_middleware(readers: dict[str, AuditState]):
    """The middleware recording every mutating request on a declared route after its handler ran (see the module
    docstring); ``readers``: the state reader of each PUT, PATCH and DELETE operation, by operationId (read at
    each request)."""

    @web.middleware
    async def audit(request: web.Request, handler) -> web.StreamResponse:
        return await _audit(request, handler, readers)

    return audit


async def _audit(request: web.Request, handler, readers: dict[str, AuditState]) -> web.StreamResponse:
    if not _audited(request):
        return await handler(request)
    received, started = datetime.now(UTC), time.perf_counter()
    reader = _state_reader(request, readers)
    before = await _read_state(request, reader) if reader else (None, None)
    try:
        resp = await handler(request)
    except web.HTTPException as exc:   # below 400 (the problems middleware answers the rest): a redirect
        await _record(request, None, exc.status, received, started)
        raise
    except asyncio.CancelledError:     # the server stops mid-request: whether it changed anything is unknown
        await asyncio.shield(_record(request, None, 499, received, started))
        raise
    if resp.status == 429:   # refused for its rate before anything ran: counted, not recorded (a flood would
        return resp          # otherwise grow the chain by a row per refusal: docs/audit.md)
    change = await _change(request, reader, before, resp.status)
    if await _record(request, resp, resp.status, received, started, change) or resp.prepared:
        return resp      # a streamed answer (a followed console, an export) is already sent: logged and counted
    failed = ProblemError(500, "the request may have been carried out but could not be audited; it has been "
                               "logged, check the resource before retrying", slug="audit-failed")
    return problem_response(failed, request.rel_url.raw_path)
