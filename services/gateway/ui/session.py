"""The dashboard's sign-in: an API key typed into /ui/login becomes an access token (minted as POST /v1/auth/token
mints it) held in an HttpOnly, SameSite=Strict cookie scoped to /ui. The API itself never reads the cookie: it stays
bearer-only; the dashboard's handlers authenticate the cookie's token themselves (``principal``), with the same
verification, revocation list and expiry as a bearer token.

The dashboard is read-only; its only state-changing requests are the sign-in and sign-out POSTs, which must carry an
Origin of this host (a cross-site form cannot sign a browser in or out)."""
from __future__ import annotations

from urllib.parse import urlsplit

from aiohttp import web

from ..adapters import identity
from ..domain.keys import hash_api_key
from ..domain.model import Principal
from ..http.auth import unauthorized
from ..http.problems import ProblemError
from ..http.state import gateway_of

COOKIE = "tessera_ui"
COOKIE_PATH = "/ui"
UI_PRINCIPAL = web.RequestKey("ui_principal", Principal)
_MAX_KEY = 512


async def principal(request: web.Request) -> Principal:
    """The signed-in caller (cached on the request); raises a 401 ProblemError when the cookie is absent, expired,
    revoked or not a token of ours."""
    if UI_PRINCIPAL in request:
        return request[UI_PRINCIPAL]
    token = request.cookies.get(COOKIE, "")
    if not token or not (token.isascii() and token.isprintable()):
        raise unauthorized("sign in at /ui/login")
    request[UI_PRINCIPAL] = p = await gateway_of(request).tokens.authenticate(token)
    return p


def same_origin(request: web.Request) -> bool:
    """The request's Origin names this host (a browser sends it on every POST)."""
    origin = request.headers.get("Origin", "")
    return bool(origin) and origin != "null" and urlsplit(origin).netloc == request.host


def _set_cookie(resp: web.StreamResponse, request: web.Request, token: str, max_age: int) -> None:
    resp.set_cookie(COOKIE, token, max_age=max_age, path=COOKIE_PATH, httponly=True, samesite="Strict",
                    secure=request.secure)


async def sign_in(request: web.Request, api_key: str) -> web.Response:
    """Trade ``api_key`` for a token in the cookie and send the browser to /ui/; a 401 ProblemError for a key that
    is unknown, revoked or expired, or whose user is disabled (the same answer for each, as the API gives)."""
    key = api_key.strip()
    if not key or len(key) > _MAX_KEY or not (key.isascii() and key.isprintable()):
        raise unauthorized("unknown or revoked API key", "ApiKey")
    gw = gateway_of(request)
    async with gw.pool.acquire() as conn:
        row = await identity.user_for_key(conn, hash_api_key(key))
    if row is None:
        raise unauthorized("unknown or revoked API key", "ApiKey")
    p = Principal(row["id"], row["tenant_id"], row["role"], row["key_id"])
    await gw.tokens.cache.fresh()   # sign with the current signing key
    expires_at = row["expires_at"].timestamp() if row["expires_at"] is not None else None
    token, expires_in = gw.tokens.mint(p, not_after=expires_at)
    resp = web.HTTPSeeOther("/ui/")
    _set_cookie(resp, request, token, expires_in)
    return resp


def sign_out(request: web.Request) -> web.Response:
    resp = web.HTTPSeeOther("/ui/login")
    resp.del_cookie(COOKIE, path=COOKIE_PATH)
    return resp


def check_origin(request: web.Request) -> None:
    if not same_origin(request):
        raise ProblemError(403, "this form may only be sent from the dashboard's own pages", slug="cross-origin")
