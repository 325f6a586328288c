"""Authentication: API key → short-lived HS256 JWT, and the bearer check on every other /v1 route.

A token carries the user id (``sub``), tenant id (``tid``, null for provider admins), role and the id of the API
key it was issued for (``akid``); its header names the signing key (``kid``). It is verified by signature and
expiry, then against the revocation list this process holds in memory (http/credentials.py: revoked API keys and
disabled users, reloaded when a ``gateway.credential_revoked`` event arrives and every few seconds), so no
database read per request, and a revoked key's or disabled user's tokens stop at once (docs/credentials.md).
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

import jwt
import structlog
from aiohttp import web

from ..domain.credentials import signing_secret
from ..domain.model import Principal
from .credentials import CredentialCache
from .problems import ProblemError, forbidden

PRINCIPAL = web.RequestKey("principal", Principal)
KNOWN = web.RequestKey("known_principal", object)   # known_principal's answer, once per request
# the id (fingerprint) of the API key presented to POST /v1/auth/token, for the audit record (never the key)
API_KEY_ID = web.RequestKey("api_key_id", str)
_ISSUER = "tessera-gateway"
_AUDIENCE = "tessera-api"
# the only /v1 route reachable without a bearer token: it is how a token is obtained
PUBLIC_PATHS = frozenset({"/v1/auth/token"})
SEEN_TOKENS = 50_000


def unauthorized(detail: str, scheme: str = "Bearer") -> ProblemError:
    return ProblemError(401, detail, headers={"WWW-Authenticate": f'{scheme} realm="tessera"'})


class UnknownSigningKey(ProblemError):
    """The token names a signing key this process does not know (yet: a rotation elsewhere, or never)."""

    def __init__(self) -> None:
        super().__init__(401, "the access token is not valid",
                         headers={"WWW-Authenticate": 'Bearer realm="tessera"'})


@dataclass(frozen=True)
class TokenIssuer:
    """Signs and verifies access tokens: with the current signing key (its kid in the header), verifying with any
    key still in its grace; the revocation list refuses tokens of revoked keys and disabled users
    (``authenticate``). Until ``cache`` is loaded (a process without database) the plain secret signs, no kid."""

    secret: str
    ttl_s: int
    cache: CredentialCache = field(default_factory=CredentialCache, compare=False, repr=False)
    # tokens this process has authenticated: token -> (principal, exp, iat), for ``known`` (bounded: see remember)
    seen: dict[str, tuple[Principal, float, int]] = field(default_factory=dict, compare=False, repr=False)

    def mint(self, principal: Principal, now: float | None = None, not_after: float | None = None) -> tuple[str, int]:
        """A token and its lifetime in seconds: ``ttl_s``, or less when ``not_after`` (its API key's expiry) is
        sooner."""
        iat = int(now if now is not None else time.time())
        exp = iat + self.ttl_s if not_after is None else min(iat + self.ttl_s, int(not_after))
        claims = {"iss": _ISSUER, "aud": _AUDIENCE, "sub": str(principal.user_id), "role": principal.role,
                  "tid": str(principal.tenant_id) if principal.tenant_id else None, "akid": principal.api_key_id,
                  "iat": iat, "exp": exp, "jti": uuid.uuid4().hex}
        key = self.cache.keyring.current
        if key is None:
            return jwt.encode(claims, self.secret, algorithm="HS256"), exp - iat
        return jwt.encode(claims, signing_secret(self.secret, key.kid), algorithm="HS256",
                          headers={"kid": key.kid}), exp - iat

    def issue(self, principal: Principal, now: float | None = None) -> str:
        return self.mint(principal, now)[0]

    def claims(self, token: str) -> dict:
        """The token's verified claims. Raises ProblemError(401) for a bad signature, expiry or shape, or a token
        without kid made after signing keys existed; UnknownSigningKey (a 401) for a well-signed token whose kid
        this process does not accept (not yet loaded: a rotation elsewhere; or retired too long ago). The
        signature is checked first (a kid's secret is derived), so only our own tokens can ask for a reload."""
        keyring = self.cache.keyring
        try:
            kid = jwt.get_unverified_header(token).get("kid")
            if kid is not None and not isinstance(kid, str):
                raise jwt.InvalidTokenError("kid")
            key = self.secret if kid is None else signing_secret(self.secret, kid)
            claims = jwt.decode(token, key, algorithms=["HS256"], audience=_AUDIENCE, issuer=_ISSUER,
                                options={"require": ["exp", "iat", "sub", "role"]})
        except jwt.ExpiredSignatureError:
            raise unauthorized("the access token has expired") from None
        except (jwt.InvalidTokenError, ValueError, TypeError, KeyError):
            raise unauthorized("the access token is not valid") from None
        if kid is None and not keyring.accepts_legacy(claims["iat"]):
            raise unauthorized("the access token is not valid")
        if kid is not None and not keyring.verifies(kid, time.time(), self.ttl_s):
            raise UnknownSigningKey()
        return claims

    def verify(self, token: str) -> Principal:
        """The token's principal (signature and expiry only: no revocation list). Raises ProblemError(401)."""
        return _principal(self.claims(token))

    async def authenticate(self, token: str) -> Principal:
        """``verify``, with the signing keys and revocation list current: a token of a revoked API key or a
        disabled user is refused (401). May read the database (a stale list, an unknown kid)."""
        await self.cache.fresh()
        try:
            claims = self.claims(token)
        except UnknownSigningKey:
            await self.cache.reload()   # a rotation this replica has not heard of yet?
            claims = self.claims(token)
        principal = _principal(claims)
        if self.cache.revocations.refuses(principal.user_id, principal.api_key_id, claims["iat"]):
            raise unauthorized("the access token has been revoked")
        if len(self.seen) >= SEEN_TOKENS:
            self.seen.clear()   # rare (a token lives minutes): start again rather than keep an LRU on every request
        self.seen[token] = (principal, claims["exp"], claims["iat"])
        return principal

    def known(self, token: str) -> Principal | None:
        """The principal of a token this process has authenticated before, still unexpired and not revoked by
        what this process knows now and with its revocation list current; None otherwise (then ``authenticate``
        decides). From memory alone: it is
        only used to *refuse* early (http/ratelimit.py), never to let a request through."""
        hit = self.seen.get(token)
        if hit is None or self.cache.stale:   # a revocation may have been announced: authenticate reloads first
            return None
        principal, exp, iat = hit
        if exp <= time.time() or self.cache.revocations.refuses(principal.user_id, principal.api_key_id, iat):
            self.seen.pop(token, None)
            return None
        return principal


def _principal(claims: dict) -> Principal:
    try:
        tid = claims.get("tid")
        akid = claims.get("akid")
        return Principal(uuid.UUID(claims["sub"]), uuid.UUID(tid) if tid else None, claims["role"],
                         akid if isinstance(akid, str) else None)
    except (ValueError, TypeError, KeyError, AttributeError):
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
        principal = await tokens.authenticate(credentials(request, "Bearer"))
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


def known_principal(tokens: TokenIssuer, request: web.Request) -> Principal | None:
    """The principal of the request's bearer token when this replica authenticated it before (``TokenIssuer.known``:
    memory only, for refusing or ordering early, never for letting a request through); looked up once per request
    (the shedder and the fair gate both ask)."""
    if KNOWN not in request:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        request[KNOWN] = tokens.known(token.strip()) if scheme.lower() == "bearer" else None
    return request[KNOWN]
