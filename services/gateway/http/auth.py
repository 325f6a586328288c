"""Authentication: API key → short-lived HS256 JWT, and the bearer check on every other /v1 route.

A token carries the user id (``sub``), tenant id (``tid``, null for provider admins)
and role; it is verified by signature and expiry only (no database read per request),
which is why it lives minutes, not days.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

import jwt
import structlog
from aiohttp import web

from ..domain.model import Principal
from .problems import ProblemError, forbidden

PRINCIPAL = web.RequestKey("principal", Principal)
# the id (fingerprint) of the API key presented to POST /v1/auth/token, for the audit record (never the key)
API_KEY_ID = web.RequestKey("api_key_id", str)
_ISSUER = "tessera-gateway"
_AUDIENCE = "tessera-api"
# the only /v1 route reachable without a bearer token: it is how a token is obtained
PUBLIC_PATHS = frozenset({"/v1/auth/token"})


def unauthorized(detail: str, scheme: str = "Bearer") -> ProblemError:
    return ProblemError(401, detail, headers={"WWW-Authenticate": f'{scheme} realm="tessera"'})


@dataclass(frozen=True)
class TokenIssuer:
    """Signs and verifies access tokens with one shared secret."""

    secret: str
    ttl_s: int

    def issue(self, principal: Principal, now: float | None = None) -> str:
        iat = int(now if now is not None else time.time())
        claims = {"iss": _ISSUER, "aud": _AUDIENCE, "sub": str(principal.user_id), "role": principal.role,
                  "tid": str(principal.tenant_id) if principal.tenant_id else None, "akid": principal.api_key_id,
                  "iat": iat, "exp": iat + self.ttl_s, "jti": uuid.uuid4().hex}
        return jwt.encode(claims, self.secret, algorithm="HS256")

    def verify(self, token: str) -> Principal:
        """The token's principal. Raises ProblemError(401) for a bad signature, expiry or shape."""
        try:
            claims = jwt.decode(token, self.secret, algorithms=["HS256"], audience=_AUDIENCE, issuer=_ISSUER,
                                options={"require": ["exp", "iat", "sub", "role"]})
            tid = claims.get("tid")
            akid = claims.get("akid")
            return Principal(uuid.UUID(claims["sub"]), uuid.UUID(tid) if tid else None, claims["role"],
                             akid if isinstance(akid, str) else None)
        except jwt.ExpiredSignatureError:
            raise unauthorized("the access token has expired") from None
        except (jwt.InvalidTokenError, ValueError, TypeError, KeyError):
            raise unauthorized("the access token is not valid") from None


def credentials(request: web.Request, scheme: str) -> str:
    """The credential of ``Authorization: <scheme> <credential>``; raises 401 when absent."""
    header = request.headers.get("Authorization", "")
    given, _, value = header.partition(" ")
    value = value.strip()
    # keys and tokens are visible ASCII; anything else (a byte >= 0x80 arrives as a lone surrogate) is no credential
    if given.lower() != scheme.lower() or not value or not (value.isascii() and value.isprintable()):
        raise unauthorized(f"send 'Authorization: {scheme} <...>'", scheme)
    return value


def auth_middleware(tokens: TokenIssuer):
    @web.middleware
    async def authenticate(request: web.Request, handler) -> web.StreamResponse:
        """Every /v1 route but the token exchange needs a valid bearer token."""
        if not request.path.startswith("/v1/") or request.path in PUBLIC_PATHS:
            return await handler(request)
        principal = tokens.verify(credentials(request, "Bearer"))
        request[PRINCIPAL] = principal
        with structlog.contextvars.bound_contextvars(user_id=str(principal.user_id),
                                                     tenant_id=str(principal.tenant_id) if principal.tenant_id else None):
            return await handler(request)

    return authenticate


def principal_of(request: web.Request) -> Principal:
    return request[PRINCIPAL]


def require_provider_admin(request: web.Request) -> Principal:
    p = principal_of(request)
    if not p.is_provider_admin:
        raise forbidden("only a provider admin may do this")
    return p


def require_tenant_member(request: web.Request) -> Principal:
    """Allocations are a tenant's: provider admins (no tenant) are refused with 403."""
    p = principal_of(request)
    if not p.may_use_allocations:
        raise forbidden("allocations belong to a tenant; sign in as a tenant admin or user")
    return p
