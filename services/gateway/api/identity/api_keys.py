"""A user's API keys (several, named, with an optional expiry) and disabling a user; the signing-key routes of
signing_keys.py are listed here too.

Who: a user manages their own keys; the tenant's admins those of every user of the tenant; provider admins
everyone's. Another tenant's members get a 404 (they learn nothing), the tenant's other users a 403. Only the
tenant's admins and provider admins disable or enable a user, never themselves.

A key is shown once, in the 201 of its creation (only its hash is stored; the audit record holds its id, never
the key). Revoking a key or disabling a user emits ``gateway.credential_revoked``: every replica reloads its
revocation list and the tokens already issued stop working on their next request (docs/credentials.md). A user's
last key may be revoked: the user then simply cannot sign in.
"""
from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
from aiohttp import web

from ...adapters import identity
from ...adapters.audit_state import StateReader, ids, select_object
from ...contracts import CredentialRevoked
from ...domain.keys import hash_api_key, new_api_key
from ...http.auth import principal_of
from ...http.endpoint import Endpoint, Param, respond
from ...http.inputs import path_uuid, read_body
from ...http.params import TENANT_ID
from ...http.problems import ProblemError, forbidden, not_found
from ...http.state import gateway_of
from . import signing_keys
from .api_key_schemas import KEY_ID_PATTERN, ApiKeyCreate, ApiKeyCreatedOut, ApiKeyList, ApiKeyOut, KeyId, UserPatch, UserStateOut

MAX_LIVE_KEYS = 20      # keys per user that can still obtain a token
LISTED_KEYS = 100
USER_ID = Param("user_id", "path", "The user's id.", uuid.UUID, required=True)
KEY_ID = Param("key_id", "path", "The API key's id (16 hex digits).", KeyId, required=True)


def _path_user(request: web.Request) -> tuple[uuid.UUID, uuid.UUID]:
    """(tenant, user) of the path when the caller may see them: 404 for another tenant's members."""
    tenant_id = path_uuid(request, "tenant_id", "user")
    user_id = path_uuid(request, "user_id", "user")
    caller = principal_of(request)
    if not caller.is_provider_admin and caller.tenant_id != tenant_id:
        raise not_found("user")
    return tenant_id, user_id


def _key_holder(request: web.Request) -> tuple[uuid.UUID, uuid.UUID]:
    """The path's user, if the caller may manage its keys: itself, its tenant's admins, provider admins."""
    tenant_id, user_id = _path_user(request)
    caller = principal_of(request)
    if caller.user_id != user_id and not caller.may_manage_users_of(tenant_id):
        raise forbidden("only the user, this tenant's admins or a provider admin may manage a user's API keys")
    return tenant_id, user_id


async def _require_user(conn: asyncpg.Connection, tenant_id: uuid.UUID, user_id: uuid.UUID) -> asyncpg.Record:
    user = await identity.tenant_user(conn, tenant_id, user_id)
    if user is None:
        raise not_found("user")
    return user


def _key_out(row: asyncpg.Record, now: datetime) -> dict:
    state = ("revoked" if row["revoked_at"] is not None
             else "expired" if row["expires_at"] is not None and row["expires_at"] <= now else "active")
    return {**dict(row), "state": state}


async def create_api_key(request: web.Request) -> web.Response:
    tenant_id, user_id = _key_holder(request)
    body = await read_body(request, ApiKeyCreate)
    now = datetime.now(UTC)
    expires_at = now + timedelta(seconds=body.expires_in_s) if body.expires_in_s is not None else None
    key, caller = new_api_key(), principal_of(request)
    async with gateway_of(request).unit_of_work("gateway.create_api_key") as uow:
        await _require_user(uow.conn, tenant_id, user_id)
        if await identity.live_api_keys(uow.conn, user_id) >= MAX_LIVE_KEYS:
            raise ProblemError(409, f"the user has {MAX_LIVE_KEYS} usable API keys already; revoke one first",
                               slug="too-many-keys", title="Too many API keys")
        row = await identity.add_api_key(uow.conn, user_id, hash_api_key(key), name=body.name,
                                         expires_at=expires_at, created_by=caller.user_id)
    return respond(ApiKeyCreatedOut(**_key_out(row, now), api_key=key), 201, headers={"Cache-Control": "no-store"})


async def list_api_keys(request: web.Request) -> web.Response:
    tenant_id, user_id = _key_holder(request)
    now = datetime.now(UTC)
    async with gateway_of(request).pool.acquire() as conn:
        await _require_user(conn, tenant_id, user_id)
        rows = await identity.list_api_keys(conn, user_id, LISTED_KEYS)
    return respond(ApiKeyList(items=[ApiKeyOut(**_key_out(r, now)) for r in rows]))


async def revoke_api_key(request: web.Request) -> web.Response:
    tenant_id, user_id = _key_holder(request)
    key_id = request.match_info["key_id"]
    if not re.fullmatch(KEY_ID_PATTERN, key_id):
        raise not_found("API key")
    gw, caller = gateway_of(request), principal_of(request)
    async with gw.unit_of_work("gateway.revoke_api_key") as uow:
        await _require_user(uow.conn, tenant_id, user_id)
        found, now_revoked = await identity.revoke_api_key(uow.conn, user_id, key_id)
        if not found:
            raise not_found("API key")
        if now_revoked:
            await uow.emit("gateway.credential_revoked", CredentialRevoked(
                kind="api_key", key_id=key_id, user_id=user_id, tenant_id=tenant_id, by=caller.user_id,
                at=datetime.now(UTC)), correlation_id=f"api-key:{key_id}", tenant_id=tenant_id)
    gw.tokens.cache.invalidate()   # this replica at once; the others when the event reaches them
    return web.Response(status=204)


async def update_user(request: web.Request) -> web.Response:
    tenant_id, user_id = _path_user(request)
    caller = principal_of(request)
    if not caller.may_manage_users_of(tenant_id):
        raise forbidden("only this tenant's admins or a provider admin may disable or enable its users")
    body = await read_body(request, UserPatch)
    if user_id == caller.user_id:
        raise ProblemError(409, "you cannot disable or enable yourself", slug="own-user")
    gw = gateway_of(request)
    async with gw.unit_of_work("gateway.update_user") as uow:
        user, changed = await identity.set_user_disabled(uow.conn, tenant_id, user_id, body.disabled)
        if user is None:
            raise not_found("user")
        if changed:   # enabling too: replicas must forget the user's "disabled" entry
            await uow.emit("gateway.credential_revoked", CredentialRevoked(
                kind="user", user_id=user_id, tenant_id=tenant_id, by=caller.user_id, at=datetime.now(UTC)),
                correlation_id=f"user:{user_id}", tenant_id=tenant_id)
    gw.tokens.cache.invalidate()
    return respond(UserStateOut(**dict(user), disabled=user["disabled_at"] is not None))


_KEYS = "/v1/tenants/{tenant_id}/users/{user_id}/api-keys"
_USER_PARAMS = (TENANT_ID, USER_ID)

def _api_key(params: dict[str, str], _principal) -> tuple:
    return uuid.UUID(params["tenant_id"]), uuid.UUID(params["user_id"]), params["key_id"]


_API_KEY = StateReader("SELECT jsonb_build_object('id', k.id, 'name', k.name, 'expires_at', k.expires_at, "
                       "'revoked_at', k.revoked_at) FROM api_keys k JOIN users u ON u.id = k.user_id "
                       "WHERE u.tenant_id = $1 AND k.user_id = $2 AND k.id = $3", _api_key)
_USER = StateReader(select_object("users", "tenant_id = $1 AND id = $2", "name", "role", "disabled_at"),
                    ids("tenant_id", "user_id"))


ENDPOINTS = [
    Endpoint("POST", _KEYS, create_api_key, "createApiKey", "Create an API key for a user (the user, the tenant's "
             "admins, or a provider admin)", "tenants", {201: ApiKeyCreatedOut}, body=ApiKeyCreate,
             params=_USER_PARAMS, errors=(400, 401, 403, 404, 409, 413, 415, 422),
             description="The response carries the key; it is shown once and only its hash is kept. A user has at "
                         f"most {MAX_LIVE_KEYS} usable keys (409 `too-many-keys`). Tokens it obtains expire no "
                         "later than the key."),
    Endpoint("GET", _KEYS, list_api_keys, "listApiKeys", "List a user's API keys (the user, the tenant's admins, or a "
             "provider admin)", "tenants", {200: ApiKeyList}, params=_USER_PARAMS, errors=(401, 403, 404),
             description="Names, ids, expiry, state and last use; never the keys."),
    Endpoint("DELETE", f"{_KEYS}/{{key_id}}", revoke_api_key, "revokeApiKey", "Revoke an API key (the user, the "
             "tenant's admins, or a provider admin)", "tenants", {204: None}, params=(*_USER_PARAMS, KEY_ID),
             errors=(401, 403, 404),
             description="The key obtains no more tokens, and the tokens it obtained stop working at once on every "
                         "replica. Answered 204 again for a key already revoked.",
             audit_state=_API_KEY),
    Endpoint("PATCH", "/v1/tenants/{tenant_id}/users/{user_id}", update_user, "updateUser",
             "Disable or enable a user (the tenant's admins, or a provider admin)", "tenants", {200: UserStateOut},
             body=UserPatch, params=_USER_PARAMS, errors=(400, 401, 403, 404, 409, 413, 415, 422),
             description="A disabled user obtains no token and the tokens it holds stop working at once; enabled "
                         "again, it signs in anew (tokens from before stay refused). Not yourself (409 `own-user`).",
             audit_state=_USER),
    *signing_keys.ENDPOINTS,
]
