"""Credentials' pure parts, without I/O: signing keys (kid in the header, the previous key accepted until its tokens
expire, unknown kids refused, tokens without kid only from before the first key), the revocation list, and the
credential cache's reload rules (single-flight, invalidation, a failed load keeps the last lists)."""
from __future__ import annotations

import asyncio
import time
import uuid

import jwt
import pytest

from services.gateway.domain.credentials import Keyring, Revocations, SigningKey, UserRevocation, new_kid, signing_secret
from services.gateway.domain.model import Principal
from services.gateway.http.auth import TokenIssuer
from services.gateway.http.credentials import CredentialCache
from services.gateway.http.problems import ProblemError

SECRET = "unit-test-secret-" + "u" * 40
TTL = 60


def _issuer(keyring: Keyring, revocations: Revocations | None = None) -> TokenIssuer:
    issuer = TokenIssuer(SECRET, TTL)
    issuer.cache.keyring, issuer.cache.revocations = keyring, revocations or Revocations()
    return issuer


def _refused(issuer: TokenIssuer, token: str) -> str:
    with pytest.raises(ProblemError) as err:
        issuer.verify(token)
    assert err.value.status == 401
    return err.value.detail


def test_the_current_key_signs_with_its_kid_in_the_header_and_a_derived_secret():
    now = time.time()
    old, new = SigningKey("k" + "0" * 16, now - 100, now - 10), SigningKey("k" + "1" * 16, now - 10)
    issuer = _issuer(Keyring((old, new), legacy_until=now - 100))
    p = Principal(uuid.uuid4(), uuid.uuid4(), "tenant_user", "ab" * 8)
    token = issuer.issue(p)
    assert jwt.get_unverified_header(token)["kid"] == new.kid
    claims = jwt.decode(token, signing_secret(SECRET, new.kid), algorithms=["HS256"], audience="tessera-api")
    assert claims["akid"] == p.api_key_id
    with pytest.raises(jwt.InvalidSignatureError):   # the plain secret is not the key
        jwt.decode(token, SECRET, algorithms=["HS256"], audience="tessera-api")
    assert issuer.verify(token) == p


def test_a_retired_key_verifies_until_its_last_token_expired_then_never():
    now = time.time()
    old, new = SigningKey(new_kid(), now - 100, now - 10), SigningKey(new_kid(), now - 10)
    p = Principal(uuid.uuid4(), None, "provider_admin")
    # signed before the key was retired
    by_old = _issuer(Keyring((SigningKey(old.kid, old.created_at),), now - 100)).issue(p, now=now - 11)
    assert _issuer(Keyring((old, new), legacy_until=now - 100)).verify(by_old) == p
    ring = Keyring((old, new), legacy_until=now - 100, grace_s=5)
    assert ring.verifies(old.kid, now - 10 + TTL + 4, TTL) and not ring.verifies(old.kid, now - 10 + TTL + 5, TTL)
    assert ring.verifies(new.kid, now + 10 ** 6, TTL)
    # once the retired key is no longer loaded (older than the window), its kid is unknown
    assert _refused(_issuer(Keyring((new,), legacy_until=now - 100)), by_old) == "the access token is not valid"


def test_an_unknown_kid_and_a_token_without_kid_after_the_first_key_are_refused():
    now = time.time()
    key = SigningKey(new_kid(), now - 100)
    issuer = _issuer(Keyring((key,), legacy_until=now - 100))
    p = Principal(uuid.uuid4(), uuid.uuid4(), "tenant_admin")
    forged = jwt.encode({"sub": str(p.user_id), "role": p.role, "iat": int(now), "exp": int(now) + 60,
                         "aud": "tessera-api", "iss": "tessera-gateway"},
                        signing_secret(SECRET, "k" + "f" * 16), algorithm="HS256", headers={"kid": "k" + "f" * 16})
    _refused(issuer, forged)
    legacy = TokenIssuer(SECRET, TTL)          # no keys loaded: plain secret, no kid
    assert "kid" not in jwt.get_unverified_header(legacy.issue(p))
    assert legacy.verify(legacy.issue(p)) == p
    _refused(issuer, legacy.issue(p))                                    # made after the first key: not ours
    assert _issuer(Keyring((key,), legacy_until=now - 30)).verify(legacy.issue(p, now=now - 31)) == p   # from before it
    assert "expired" in _refused(issuer, legacy.issue(p, now=now - 3600))


def test_tokens_of_a_revoked_key_or_a_disabled_user_are_refused_and_enabling_again_keeps_old_ones_out():
    user, other = uuid.uuid4(), uuid.uuid4()
    rv = Revocations(frozenset({"ab" * 8}), {user: UserRevocation(disabled=True, not_before=1000.5)})
    assert rv.refuses(other, "ab" * 8, 2000) and not rv.refuses(other, "cd" * 8, 2000)
    assert rv.refuses(user, None, 5000)
    enabled = Revocations(frozenset(), {user: UserRevocation(disabled=False, not_before=1000.5)})
    assert enabled.refuses(user, None, 1000) and not enabled.refuses(user, None, 1001)
    assert not Revocations().refuses(user, None, 0)


async def test_the_cache_loads_once_for_concurrent_requests_reloads_when_invalidated_and_survives_a_failed_load():
    calls, fail = [], []

    async def load():
        calls.append(1)
        await asyncio.sleep(0.01)
        if fail:
            raise OSError("database away")
        return Keyring((SigningKey("k" + str(len(calls)), 0.0),), 0.0), Revocations(frozenset({str(len(calls))}))

    cache = CredentialCache(refresh_s=60)
    await cache.fresh()
    assert calls == []                      # not attached: nothing to load
    cache.attach(load)
    await asyncio.gather(*(cache.fresh() for _ in range(10)))
    assert len(calls) == 1 and cache.revocations.api_keys == {"1"}
    await cache.fresh()
    assert len(calls) == 1                  # current
    cache.invalidate()
    await cache.fresh()
    assert len(calls) == 2 and cache.keyring.current.kid == "k2"
    await asyncio.gather(*(cache.reload() for _ in range(10)))
    # a burst of unknown kids: the first loads, and one more load serves all who asked while it ran
    assert len(calls) == 4
    fail.append(1)
    cache.invalidate()
    await cache.fresh()
    assert len(calls) == 5 and cache.revocations.api_keys == {"4"}   # the last lists stay
    await cache.fresh()
    assert len(calls) == 5                  # retried after a second, not on every request


async def test_authenticate_refuses_a_revoked_token_that_verify_alone_accepts():
    now = time.time()
    p = Principal(uuid.uuid4(), uuid.uuid4(), "tenant_user", "ab" * 8)
    issuer = _issuer(Keyring((SigningKey(new_kid(), now - 10),), now - 10), Revocations(frozenset({"ab" * 8})))
    token = issuer.issue(p)
    assert issuer.verify(token) == p
    with pytest.raises(ProblemError) as err:
        await issuer.authenticate(token)
    assert err.value.status == 401 and "revoked" in err.value.detail
