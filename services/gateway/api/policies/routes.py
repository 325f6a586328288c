"""Policies (Cedar, docs/policies.md): provider admins write the provider's and any tenant's, a tenant's admins
their tenant's; tenant users get 403. A tenant admin never sees nor touches the provider's or another tenant's
(another tenant's is a 404, as if it did not exist).

Every change is a new version (all kept: GET …/versions), is checked against the schema first (a 422 quoting the
validator), and emits ``gateway.policy_changed`` in its transaction: every replica drops its cached policies
(http.policy). The default provider policies (policy_defaults.cedar) are listed to provider admins, read-only.
"""
from __future__ import annotations

import uuid
from datetime import UTC, datetime

import asyncpg
from aiohttp import web

from ...adapters import policies as repo
from ...adapters.audit_state import StateReader, select_object
from ...contracts import PolicyChanged
from ...domain.model import Principal
from ...domain.policy import OPERATION_RESOURCE, Caller, Policy, PolicyBook, PolicyInvalid, Resource, check, parse_one
from ...http.auth import principal_of
from ...http.endpoint import Endpoint, Param, respond
from ...http.inputs import path_value, query_value, read_body
from ...http.policy import cache_of
from ...http.policy_cache import PolicySchema
from ...http.problems import ProblemError, forbidden, not_found, validation_problem
from ...http.schema_base import FieldError, text
from ...http.state import gateway_of
from ...http.tenancy import require_tenant
from .schemas import (
    PolicyCreate,
    PolicyDecision,
    PolicyEvaluate,
    PolicyList,
    PolicyOut,
    PolicyReplace,
    PolicyVersionOut,
    PolicyVersions,
)

POLICY_ID = Param("policy_id", "path", "The policy's id (a default provider policy: its @id).",
                  text(128, min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$"), required=True)
TENANT_FILTER = Param("tenant_id", "query", "Only this tenant's policies (provider admins).", uuid.UUID)


def _admin(request: web.Request) -> Principal:
    p = principal_of(request)
    if p.role == "tenant_user":
        raise forbidden("only provider admins and tenant admins manage policies")
    return p


def _invalid(exc: PolicyInvalid) -> ProblemError:
    return validation_problem([FieldError(field="text", message=str(exc)[:2000], code="invalid_policy")],
                              f"the policy does not validate: {str(exc)[:1000]}")


def _schema(request: web.Request) -> PolicySchema:
    """The Cedar schema of the route table this gateway serves (the policy middleware's)."""
    return cache_of(gateway_of(request)).schema


def _checked(request: web.Request, text_: str, tenant_id: uuid.UUID | None) -> dict:
    try:
        return check(text_, _schema(request).get()[1], tenant_id=tenant_id)
    except PolicyInvalid as exc:
        raise _invalid(exc) from None


def _out(row) -> PolicyOut:
    return PolicyOut(id=str(row["id"]), builtin=False, **{k: row[k] for k in (
        "scope", "tenant_id", "name", "description", "text", "enabled", "version", "created_by", "updated_by",
        "created_at", "updated_at")})


def _builtin_out(p: Policy) -> PolicyOut:
    return PolicyOut(id=p.policy_id, scope="provider", tenant_id=None, name=p.policy_id, description=p.reason,
                     text=f"// {p.policy_id}: see services/gateway/domain/policy_defaults.cedar", enabled=True,
                     builtin=True, version=1, created_by=None, updated_by=None, created_at=None, updated_at=None)


def _builtin(request: web.Request, policy_id: str) -> Policy | None:
    return next((p for p in _schema(request).get()[2] if p.policy_id == policy_id), None)


def _may_touch(p: Principal, scope: str, tenant_id: uuid.UUID | None) -> bool:
    return p.is_provider_admin or (p.role == "tenant_admin" and scope == "tenant" and tenant_id == p.tenant_id)


async def _emit(request: web.Request, uow, row, change: str) -> None:
    caller = principal_of(request)
    await uow.emit("gateway.policy_changed", PolicyChanged(
        policy_id=str(row["id"]), scope=row["scope"], tenant_id=row["tenant_id"], version=row["version"],
        change=change, by=caller.user_id, at=datetime.now(UTC)), correlation_id=f"policy:{row['id']}",
        tenant_id=row["tenant_id"])
    cache = cache_of(gateway_of(request))

    async def invalidate() -> None:
        cache.invalidate()
    uow.on_commit(invalidate)


async def create_policy(request: web.Request) -> web.Response:
    p = _admin(request)
    body = await read_body(request, PolicyCreate)
    tenant_id = body.tenant_id
    if body.scope == "provider":
        if not p.is_provider_admin:
            raise forbidden("only a provider admin may write provider policies")
        if tenant_id is not None:
            raise validation_problem([FieldError(field="tenant_id", message="a provider policy has no tenant",
                                                 code="provider_scope")])
    else:
        tenant_id = tenant_id or p.tenant_id
        if tenant_id is None:
            raise validation_problem([FieldError(field="tenant_id", message="name the tenant of a tenant policy",
                                                 code="missing")])
        if not _may_touch(p, "tenant", tenant_id):
            raise not_found("tenant")
    _checked(request, body.text, tenant_id)
    async with gateway_of(request).unit_of_work("gateway.create_policy") as uow:
        if tenant_id is not None:
            await require_tenant(uow.conn, tenant_id)
        row = await repo.insert(uow.conn, {"id": uuid.uuid4(), "scope": body.scope, "tenant_id": tenant_id,
                                           "name": body.name, "description": body.description, "text": body.text,
                                           "enabled": body.enabled}, p.user_id)
        await _emit(request, uow, row, "created")
    return respond(_out(row), 201, headers={"Location": f"/v1/policies/{row['id']}"})


async def _visible(conn: asyncpg.Connection, request: web.Request, *, lock: bool = False):
    """The stored policy of the path if the caller may manage it (404 otherwise; 409 for a built-in one)."""
    p = _admin(request)
    raw = path_value(request, POLICY_ID)
    try:
        policy_id = uuid.UUID(raw)
    except ValueError:
        if p.is_provider_admin and _builtin(request, raw) is not None:
            raise ProblemError(409, f"{raw} is a default provider policy: read-only (policy_defaults.cedar)") from None
        raise not_found("policy") from None
    row = await repo.get(conn, policy_id, lock=lock)
    if row is None or not _may_touch(p, row["scope"], row["tenant_id"]):
        raise not_found("policy")
    return row


async def get_policy(request: web.Request) -> web.Response:
    found = _builtin(request, request.match_info["policy_id"])
    if found is not None and _admin(request).is_provider_admin:
        return respond(_builtin_out(found))
    async with gateway_of(request).pool.acquire() as conn:
        return respond(_out(await _visible(conn, request)))


async def list_policies(request: web.Request) -> web.Response:
    p = _admin(request)
    only = query_value(request, TENANT_FILTER)
    async with gateway_of(request).pool.acquire() as conn:
        if p.is_provider_admin:
            rows = await repo.listed(conn, provider=only is None, tenant_id=only, every_tenant=only is None)
        else:
            rows = await repo.listed(conn, provider=False, tenant_id=p.tenant_id)
    builtins = [_builtin_out(b) for b in _schema(request).get()[2]] if p.is_provider_admin and only is None else []
    return respond(PolicyList(items=builtins + [_out(r) for r in rows]))


async def replace_policy(request: web.Request) -> web.Response:
    _admin(request)
    body = await read_body(request, PolicyReplace)
    async with gateway_of(request).unit_of_work("gateway.replace_policy") as uow:
        row = await _visible(uow.conn, request, lock=True)
        _checked(request, body.text, row["tenant_id"])
        row = await repo.replace(uow.conn, row["id"], body.model_dump(), principal_of(request).user_id)
        await _emit(request, uow, row, "updated")
    return respond(_out(row))


async def delete_policy(request: web.Request) -> web.Response:
    async with gateway_of(request).unit_of_work("gateway.delete_policy") as uow:
        row = await _visible(uow.conn, request, lock=True)
        await repo.delete(uow.conn, row, principal_of(request).user_id)
        await _emit(request, uow, {**dict(row), "version": row["version"] + 1}, "deleted")
    return web.Response(status=204)


async def list_versions(request: web.Request) -> web.Response:
    async with gateway_of(request).pool.acquire() as conn:
        row = await _visible(conn, request)
        versions = await repo.versions(conn, row["id"])
    return respond(PolicyVersions(policy_id=row["id"], items=[PolicyVersionOut(**{k: v[k] for k in (
        "version", "name", "description", "text", "enabled", "deleted", "by", "at")}) for v in versions]))


async def evaluate_policy(request: web.Request) -> web.Response:
    p = _admin(request)
    body = await read_body(request, PolicyEvaluate)
    tenant_id = body.tenant_id if p.is_provider_admin else p.tenant_id
    if not p.is_provider_admin and body.tenant_id not in (None, p.tenant_id):
        raise not_found("tenant")
    endpoint = _schema(request).judged.get(body.operation)
    if endpoint is None:
        raise validation_problem([FieldError(field="operation", message="not a mutating operation the policies "
                                             "judge (see docs/policies.md)", code="unknown_operation")])
    scope = "provider" if p.is_provider_admin else "tenant"
    candidate = []
    if body.candidate is not None:
        _checked(request, body.candidate, tenant_id if scope == "tenant" else None)
        candidate = [Policy("candidate", scope, tenant_id if scope == "tenant" else None, parse_one(body.candidate))]
    book = await cache_of(gateway_of(request)).book()
    trial = PolicyBook(book.schema, book.policies + candidate)
    kind = OPERATION_RESOURCE.get(body.operation, "Target")
    defaults = {"method": endpoint.method, "path": endpoint.path} if kind == "Target" else {}
    resource = Resource(body.operation, kind, {**defaults, **body.resource}, body.tags)
    decision = trial.decide(Caller(uuid.uuid4(), body.role, tenant_id), resource)
    return respond(PolicyDecision(allowed=decision.allowed, policy_ids=list(decision.policy_ids),
                                  reason=decision.reason, errors=list(decision.errors)))


_ONE = "/v1/policies/{policy_id}"
_WRITE_ERRORS = (400, 401, 403, 404, 413, 415, 422)

def _policy_key(params: dict[str, str], principal) -> tuple:
    return uuid.UUID(params["policy_id"]), principal.tenant_id   # a tenant admin reads its own tenant's only


_POLICY = StateReader(select_object("policies", "id = $1 AND ($2::uuid IS NULL OR tenant_id = $2)", "scope",
                                    "tenant_id", "name", "version", "enabled", "text"), _policy_key)


ENDPOINTS = [
    Endpoint("POST", "/v1/policies", create_policy, "createPolicy", "Create a provider or tenant policy (Cedar)",
             "policies", {201: PolicyOut}, body=PolicyCreate, errors=_WRITE_ERRORS,
             headers={201: {"Location": "The policy (/v1/policies/{id})."}},
             description="Provider policies (provider admins) apply to every tenant and cannot be overridden; a "
                         "tenant's policies (its admins, or a provider admin) apply to its members only and can "
                         "only narrow (forbid wins). Applies within a second on every gateway replica. Rules the "
                         "schema cannot state: `text` is exactly one static Cedar policy that validates against the "
                         "policy schema (docs/policies.md) and, in a tenant policy, names no other tenant (a 422 "
                         "quoting the validator); a tenant policy names its tenant in `tenant_id` when a provider "
                         "admin writes it (a tenant admin's defaults to its own; a 422 otherwise), a tenant that "
                         "exists (a 404); a tenant admin writes its own tenant's policies only (403 for a provider "
                         "policy, 404 for another tenant's)."),
    Endpoint("GET", "/v1/policies", list_policies, "listPolicies", "List the policies the caller manages", "policies",
             {200: PolicyList}, params=(TENANT_FILTER,), errors=(401, 403, 422),
             description="Provider admins: the defaults (builtin), the provider's and every tenant's (or one "
                         "tenant's: tenant_id). Tenant admins: their tenant's only."),
    Endpoint("GET", _ONE, get_policy, "getPolicy", "Read a policy", "policies", {200: PolicyOut}, params=(POLICY_ID,),
             errors=(401, 403, 404, 422)),
    Endpoint("PUT", _ONE, replace_policy, "replacePolicy", "Replace a policy (a new version)", "policies",
             {200: PolicyOut}, body=PolicyReplace, params=(POLICY_ID,), errors=_WRITE_ERRORS + (409,),
             description="The text is checked as on creation; every version is kept (GET …/versions). A default "
                         "provider policy is read-only (409).",
             audit_state=_POLICY),
    Endpoint("DELETE", _ONE, delete_policy, "deletePolicy", "Delete a policy", "policies", {204: None},
             params=(POLICY_ID,), errors=(401, 403, 404, 409, 422),
             description="Applies within a second on every replica. Its versions stay in the database (the last one "
                         "marked deleted); a default provider policy is read-only (409).",
             audit_state=_POLICY),
    Endpoint("GET", _ONE + "/versions", list_versions, "listPolicyVersions", "List a policy's versions", "policies",
             {200: PolicyVersions}, params=(POLICY_ID,), errors=(401, 403, 404, 422)),
    Endpoint("POST", "/v1/policies/evaluate", evaluate_policy, "evaluatePolicy", "What a request would get under the "
             "policies in force (and an optional candidate policy)", "policies", {200: PolicyDecision},
             body=PolicyEvaluate, errors=_WRITE_ERRORS,
             description="For admins who test a policy before enabling it: give the operation, the resource's "
                         "attributes and tags and, optionally, a candidate policy (added to the caller's layer: "
                         "provider admins the provider's, tenant admins their tenant's). Nothing is stored. Rules "
                         "the schema cannot state: `operation` is one the policies judge, that is every POST, PUT, "
                         "PATCH and DELETE operation of this document but createToken, createPolicy, replacePolicy, "
                         "deletePolicy and evaluatePolicy (a 422); `candidate` is exactly one static Cedar policy "
                         "that validates against the policy schema (a 422 quoting the validator); a tenant admin's "
                         "`tenant_id` is its own tenant (a 404 otherwise)."),
]
