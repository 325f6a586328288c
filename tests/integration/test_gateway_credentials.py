"""Credentials through the gateway against real PostgreSQL and NATS: several named API keys per user with an expiry,
revocation and disabled users stopping issued tokens at once on every replica (the event, not the periodic reload:
the second replica here reloads only every 10 minutes on its own), and rotating signing keys."""
from __future__ import annotations

import time
import uuid

import jwt

from services.gateway.domain.credentials import signing_secret
from services.gateway.domain.model import Principal
from services.gateway.http.auth import TokenIssuer
from tests.support.gateway import TOKEN_SECRET, Client, assert_problem
from tests.support.polling import eventually

EVENT_WITHIN_S = 5.0      # an event reaches the other replica well within this; its own reload is 10 minutes away


async def _exchange(api, key: str):
    return await api.anonymous().post("/v1/auth/token", headers={"Authorization": f"ApiKey {key}"})


async def _status(client: Client, path: str) -> int:
    return (await client.get(path)).status


def _on(api, client: Client) -> Client:
    """The same token, sent to another replica."""
    return Client(api.http, client.token)


async def _replicas(gateway):
    first = await gateway()
    second = await gateway(credentials_refresh_s=600.0)   # learns of changes from the event only
    return first, second


async def test_a_user_has_several_named_keys_and_an_expired_key_obtains_no_token(api):
    tenant_id = await api.new_tenant()
    user, created = await api.new_user(tenant_id)
    keys = f"/v1/tenants/{tenant_id}/users/{created['id']}/api-keys"
    laptop = await user.post(keys, {"name": "laptop"})
    assert laptop.status == 201 and laptop.body["api_key"].startswith("tsk_") and laptop.body["state"] == "active"
    assert laptop.headers.get("Cache-Control") == "no-store"
    ci = await user.post(keys, {"name": "ci", "expires_in_s": 2})
    assert ci.status == 201 and ci.body["expires_at"], ci.body
    token = await _exchange(api, ci.body["api_key"])
    assert token.status == 200 and token.body["expires_in"] <= 2   # no token outlives its key
    listed = await user.get(keys)
    assert listed.status == 200
    assert {k["name"] for k in listed.body["items"]} == {"default", "laptop", "ci"}
    assert all("api_key" not in k for k in listed.body["items"])
    assert (await _exchange(api, laptop.body["api_key"])).status == 200
    await eventually(lambda: _exchange(api, ci.body["api_key"]), until=lambda r: r.status == 401, timeout=10,
                     what="the expired key to be refused")
    assert_problem(await _exchange(api, ci.body["api_key"]), 401)
    states = {k["name"]: k["state"] for k in (await user.get(keys)).body["items"]}
    assert states == {"default": "active", "laptop": "active", "ci": "expired"}
    for bad in ({"name": "never", "expires_in_s": 0}, {"name": "dated", "expires_at": "2030-01-01T00:00:00Z"}):
        assert_problem(await user.post(keys, bad), 422, next(iter(set(bad) - {"name"})))
    # the audit trail names the key by its id and never holds the key
    assert await api.scalar("SELECT count(*) FROM audit_log WHERE audit_log::text LIKE '%' || $1 || '%'",
                            laptop.body["api_key"]) == 0
    assert await api.scalar("SELECT count(*) FROM audit_log WHERE action = 'createApiKey' AND target_id = $1",
                            laptop.body["id"]) == 1


async def test_a_revoked_keys_token_stops_at_once_on_every_replica_while_the_users_other_key_works(gateway):
    first, second = await _replicas(gateway)
    tenant_id = await first.new_tenant()
    admin, _ = await first.new_user(tenant_id, "tenant_admin")
    user, created = await first.new_user(tenant_id)
    keys = f"/v1/tenants/{tenant_id}/users/{created['id']}/api-keys"
    other = await admin.post(keys, {"name": "second"})
    assert other.status == 201
    by_other = await first.login(other.body["api_key"])
    me = f"/v1/tenants/{tenant_id}/users/{created['id']}/api-keys"
    assert await _status(user, me) == await _status(_on(second, user), me) == 200
    [default] = [k for k in (await admin.get(keys)).body["items"] if k["name"] == "default"]
    assert jwt.decode(user.token, options={"verify_signature": False})["akid"] == default["id"]
    assert (await admin.delete(f"{keys}/{default['id']}")).status == 204
    assert_problem(await user.get(me), 401)                           # this replica: at once
    await eventually(lambda: _status(_on(second, user), me), until=lambda s: s == 401, timeout=EVENT_WITHIN_S,
                     what="the other replica to refuse the revoked key's token")
    assert await _status(by_other, me) == await _status(_on(second, by_other), me) == 200
    assert_problem(await _exchange(first, created["api_key"]), 401)
    assert (await admin.delete(f"{keys}/{default['id']}")).status == 204   # again: still revoked
    assert_problem(await admin.delete(f"{keys}/{'0' * 16}"), 404)
    assert_problem(await admin.delete(f"{keys}/not-a-key"), 404)
    states = {k["name"]: k["state"] for k in (await admin.get(keys)).body["items"]}
    assert states == {"default": "revoked", "second": "active"}


async def test_a_user_revokes_their_own_key_and_nobody_reaches_another_users_or_tenants_keys(api):
    tenant_id, elsewhere = await api.new_tenant(), await api.new_tenant()
    user, created = await api.new_user(tenant_id)
    colleague, peer = await api.new_user(tenant_id)
    stranger, _ = await api.new_user(elsewhere, "tenant_admin")
    keys = f"/v1/tenants/{tenant_id}/users/{created['id']}/api-keys"
    spare = await user.post(keys, {"name": "spare"})
    [default] = [k for k in (await user.get(keys)).body["items"] if k["name"] == "default"]
    assert (await user.delete(f"{keys}/{default['id']}")).status == 204
    assert_problem(await user.get(keys), 401)
    user = await api.login(spare.body["api_key"])
    assert (await user.delete(f"{keys}/{spare.body['id']}")).status == 204   # the last key too
    assert_problem(await _exchange(api, spare.body["api_key"]), 401)
    theirs = f"/v1/tenants/{tenant_id}/users/{peer['id']}/api-keys"
    assert_problem(await user.get(theirs), 401)
    assert_problem(await colleague.get(f"/v1/tenants/{tenant_id}/users/{created['id']}/api-keys"), 403)
    assert_problem(await colleague.post(f"/v1/tenants/{tenant_id}/users/{created['id']}/api-keys", {"name": "x"}), 403)
    assert_problem(await colleague.call("PATCH", f"/v1/tenants/{tenant_id}/users/{peer['id']}",
                                        json_body={"disabled": True}), 403)
    for method, path, body in (("GET", theirs, None), ("POST", theirs, {"name": "x"}),
                               ("DELETE", f"{theirs}/{'0' * 16}", None),
                               ("PATCH", f"/v1/tenants/{tenant_id}/users/{peer['id']}", {"disabled": True})):
        assert_problem(await stranger.call(method, path, json_body=body), 404)
    assert_problem(await colleague.get(f"/v1/tenants/{tenant_id}/users/{uuid.uuid4()}/api-keys"), 403)
    admin = await api.admin()
    assert_problem(await admin.get(f"/v1/tenants/{tenant_id}/users/{uuid.uuid4()}/api-keys"), 404)
    assert_problem(await admin.get(f"/v1/tenants/{elsewhere}/users/{peer['id']}/api-keys"), 404)


async def test_a_disabled_users_tokens_stop_at_once_it_gets_no_new_one_and_enabled_again_it_signs_in_anew(gateway):
    first, second = await _replicas(gateway)
    tenant_id = await first.new_tenant()
    admin, admin_user = await first.new_user(tenant_id, "tenant_admin")
    user, created = await first.new_user(tenant_id)
    me = f"/v1/tenants/{tenant_id}/users/{created['id']}"
    keys = f"{me}/api-keys"
    assert await _status(_on(second, user), keys) == 200
    r = await admin.call("PATCH", me, json_body={"disabled": True})
    assert r.status == 200 and r.body["disabled"] is True and r.body["disabled_at"], r.body
    assert_problem(await user.get(keys), 401)
    await eventually(lambda: _status(_on(second, user), keys), until=lambda s: s == 401, timeout=EVENT_WITHIN_S,
                     what="the other replica to refuse the disabled user's token")
    assert_problem(await _exchange(first, created["api_key"]), 401)
    assert_problem(await admin.call("PATCH", f"/v1/tenants/{tenant_id}/users/{admin_user['id']}",
                                    json_body={"disabled": True}), 409)
    r = await admin.call("PATCH", me, json_body={"disabled": False})
    assert r.status == 200 and r.body["disabled"] is False and r.body["disabled_at"] is None
    assert_problem(await user.get(keys), 401)          # tokens from before the disabling stay refused

    async def signed_in_anew() -> bool:
        again = await _exchange(first, created["api_key"])
        return again.status == 200 and await _status(Client(second.http, again.body["access_token"]), keys) == 200
    await eventually(signed_in_anew, timeout=EVENT_WITHIN_S, what="the enabled user to sign in on both replicas")


async def test_after_a_rotation_the_previous_keys_tokens_work_until_they_expire_and_unknown_kids_are_refused(gateway):
    first = await gateway(token_ttl_s=4)
    second = await gateway(credentials_refresh_s=600.0)
    admin = await first.admin()
    before = jwt.get_unverified_header(admin.token)["kid"]
    rotated = await admin.post("/v1/ops/signing-keys/rotate")
    assert rotated.status == 200, rotated.body
    current = [k for k in rotated.body["items"] if k["current"]]
    assert len(current) == 1 and current[0]["kid"] != before
    assert [k["verifies_until"] for k in rotated.body["items"] if k["kid"] == before] != [None]
    assert await _status(admin, "/v1/tenants") == 200              # the previous key's token still works
    fresh = await first.admin()
    assert jwt.get_unverified_header(fresh.token)["kid"] == current[0]["kid"]
    assert await _status(_on(second, fresh), "/v1/tenants") == 200   # the other replica learns the new key
    await eventually(lambda: _status(admin, "/v1/tenants"), until=lambda s: s == 401, timeout=10,
                     what="the previous key's token to expire")
    claims = jwt.decode(fresh.token, options={"verify_signature": False})
    unknown = "k" + "0" * 16
    forged = jwt.encode(claims, signing_secret(TOKEN_SECRET, unknown), algorithm="HS256", headers={"kid": unknown})
    assert_problem(await Client(first.http, forged).get("/v1/tenants"), 401)
    legacy = TokenIssuer(TOKEN_SECRET, 60).issue(Principal(uuid.UUID(claims["sub"]), None, "provider_admin"),
                                                 now=time.time())
    assert_problem(await Client(first.http, legacy).get("/v1/tenants"), 401)   # no kid, made after signing keys
    tenant_admin, _ = await first.tenant_user("tenant_admin")
    assert_problem(await tenant_admin.post("/v1/ops/signing-keys/rotate"), 403)
