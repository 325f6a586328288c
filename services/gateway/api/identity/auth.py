"""POST /v1/auth/token: trade an API key for a short-lived bearer token (signed with the current signing key)."""
from __future__ import annotations

from aiohttp import web

from ...adapters import identity
from ...domain.audit import api_key_id
from ...domain.keys import hash_api_key
from ...domain.model import Principal
from ...http.auth import API_KEY_ID, PRINCIPAL, credentials, unauthorized
from ...http.endpoint import Endpoint, respond
from ...http.state import gateway_of
from .schemas import TokenOut


async def exchange_token(request: web.Request) -> web.Response:
    gw = gateway_of(request)
    key = credentials(request, "ApiKey")
    request[API_KEY_ID] = api_key_id(key)   # for the audit record: the key's id, never the key
    async with gw.pool.acquire() as conn:
        row = await identity.user_for_key(conn, hash_api_key(key))
    if row is None:   # unknown, revoked or expired key, or a disabled user: the same answer, nothing more said
        raise unauthorized("unknown or revoked API key", "ApiKey")
    principal = Principal(row["id"], row["tenant_id"], row["role"], row["key_id"])
    request[PRINCIPAL] = principal          # the caller, for the access log and the audit record
    await gw.tokens.cache.fresh()           # sign with the current signing key
    expires_at = row["expires_at"].timestamp() if row["expires_at"] is not None else None
    token, expires_in = gw.tokens.mint(principal, not_after=expires_at)
    return respond(TokenOut(access_token=token, expires_in=expires_in), headers={"Cache-Control": "no-store"})


ENDPOINTS = [
    Endpoint("POST", "/v1/auth/token", exchange_token, "createToken", "Exchange an API key for a bearer token", "auth",
             {200: TokenOut}, errors=(401,), security="api_key",
             description="Send `Authorization: ApiKey <key>`. The token carries user, tenant and role and expires "
                         "after `expires_in` seconds (no later than the key's own expiry); every other /v1 operation "
                         "needs `Authorization: Bearer <token>`. A revoked or expired key, or a disabled user, gets "
                         "the same 401 as an unknown key."),
]
