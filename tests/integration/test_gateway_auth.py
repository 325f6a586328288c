"""Gateway identity against real PostgreSQL/NATS: API keys, bearer tokens, roles, tenants and users."""
from __future__ import annotations

import time
import uuid

import jwt

from services.gateway.domain.credentials import signing_secret
from services.gateway.domain.model import Principal
from services.gateway.http.auth import TokenIssuer
from tests.support.gateway import ADMIN_KEY, TOKEN_SECRET, Client

PROVIDER_ONLY = [("POST", "/v1/tenants", {"name": "x"}), ("GET", "/v1/tenants", None),
                 ("POST", "/v1/nodes", {"name": "n1", "gpu_model": "H100", "gpu_count": 8}), ("GET", "/v1/nodes", None),
                 ("GET", "/v1/ops/dead-letters", None), ("GET", "/v1/ops/events", None)]


async def test_api_key_exchanges_for_a_bearer_token_carrying_user_tenant_and_role(api):
    tenant_id = await api.new_tenant()
    _, user = await api.new_user(tenant_id, "tenant_admin")
    assert user["api_key"].startswith("tsk_") and user["tenant_id"] == tenant_id and user["role"] == "tenant_admin"
    r = await api.anonymous().post("/v1/auth/token", headers={"Authorization": f"ApiKey {user['api_key']}"})
    assert r.status == 200
    assert r.body["token_type"] == "Bearer" and r.body["expires_in"] == 900
    kid = jwt.get_unverified_header(r.body["access_token"])["kid"]    # signed with the current signing key
    claims = jwt.decode(r.body["access_token"], signing_secret(TOKEN_SECRET, kid), algorithms=["HS256"],
                        audience="tessera-api")
    assert claims["sub"] == user["id"] and claims["tid"] == tenant_id and claims["role"] == "tenant_admin"
    assert claims["exp"] - claims["iat"] == 900
    # only the hash of the key is stored
    assert await api.scalar("SELECT count(*) FROM api_keys WHERE key_hash=$1", user["api_key"]) == 0
    assert await api.scalar("SELECT count(*) FROM api_keys WHERE user_id=$1", uuid.UUID(user["id"])) == 1


async def test_unknown_or_missing_api_key_gets_401_problem(api):
    for headers in ({"Authorization": "ApiKey tsk_not_a_real_key"}, {}, {"Authorization": f"Bearer {ADMIN_KEY}"}):
        r = await api.anonymous().post("/v1/auth/token", headers=headers)
        assert r.status == 401, headers
        assert r.content_type == "application/problem+json"
        assert r.body["status"] == 401 and r.body["type"].endswith("/unauthorized")


async def test_missing_malformed_forged_and_expired_tokens_get_401(api):
    admin = await api.admin()
    good = await admin.get("/v1/tenants")
    assert good.status == 200
    principal = Principal(uuid.uuid4(), None, "provider_admin")
    expired = TokenIssuer(TOKEN_SECRET, 60).issue(principal, now=time.time() - 3600)
    forged = TokenIssuer("another-secret-" + "z" * 40, 60).issue(principal)
    for token in (None, "not-a-jwt", forged, expired):
        r = await Client(api.http, token).get("/v1/tenants")
        assert r.status == 401, token
        assert r.content_type == "application/problem+json"
        assert r.headers.get("WWW-Authenticate", "").startswith("Bearer")
    r = await Client(api.http, expired).get("/v1/tenants")
    assert "expired" in r.body["detail"]


async def test_tenant_members_get_403_on_provider_admin_endpoints(api):
    for role in ("tenant_user", "tenant_admin"):
        client, _ = await api.tenant_user(role)
        for method, path, body in PROVIDER_ONLY:
            r = await client.call(method, path, json_body=body)
            assert r.status == 403, (role, method, path, r.body)
            assert r.content_type == "application/problem+json"


async def test_provider_admin_cannot_create_allocations(api):
    r = await (await api.admin()).post("/v1/allocations", {"name": "a1", "shape": "vm.1gpu"})
    assert r.status == 403
    assert r.content_type == "application/problem+json"


async def test_bootstrap_admin_is_created_once_and_survives_restarts(gateway):
    first = await gateway()
    await first.admin()
    second = await gateway()   # a second start (same database) must not duplicate the admin or its key
    await second.admin()
    assert await second.scalar("SELECT count(*) FROM users WHERE tenant_id IS NULL AND name='admin'") == 1
    assert await second.scalar("SELECT count(*) FROM api_keys k JOIN users u ON u.id=k.user_id "
                               "WHERE u.name='admin' AND u.tenant_id IS NULL AND k.revoked_at IS NULL") == 1


async def test_changing_the_bootstrap_key_revokes_the_old_one(gateway):
    new_key = f"tsk_rotated_{uuid.uuid4().hex}"
    api = await gateway(bootstrap_admin_key=new_key)
    assert (await api.anonymous().post("/v1/auth/token", headers={"Authorization": f"ApiKey {new_key}"})).status == 200
    assert (await api.anonymous().post("/v1/auth/token", headers={"Authorization": f"ApiKey {ADMIN_KEY}"})).status == 401
    api = await gateway()   # back to the suite's key for the tests that follow
    await api.admin()


async def test_provider_admin_creates_and_lists_tenants_and_names_are_unique(api):
    admin = await api.admin()
    name = f"acme-{uuid.uuid4().hex[:8]}"
    r = await admin.post("/v1/tenants", {"name": name})
    assert r.status == 201 and r.body["name"] == name
    assert (await admin.post("/v1/tenants", {"name": name})).status == 409
    listed = await admin.get("/v1/tenants")
    assert [t for t in listed.body["items"] if t["name"] == name] == [r.body]


async def test_tenant_admin_manages_only_its_own_tenants_users(api):
    tenant_a, tenant_b = await api.new_tenant(), await api.new_tenant()
    admin_a, _ = await api.new_user(tenant_a, "tenant_admin")
    user_a, _ = await api.new_user(tenant_a, "tenant_user")
    created = await admin_a.post(f"/v1/tenants/{tenant_a}/users", {"name": "bob", "role": "tenant_user"})
    assert created.status == 201 and created.body["tenant_id"] == tenant_a
    assert (await admin_a.post(f"/v1/tenants/{tenant_a}/users", {"name": "bob", "role": "tenant_user"})).status == 409
    listed = await admin_a.get(f"/v1/tenants/{tenant_a}/users")
    assert listed.status == 200 and "bob" in {u["name"] for u in listed.body["items"]}
    assert all("api_key" not in u for u in listed.body["items"])
    assert (await admin_a.get(f"/v1/tenants/{tenant_b}/users")).status == 403
    assert (await admin_a.post(f"/v1/tenants/{tenant_b}/users", {"name": "eve", "role": "tenant_user"})).status == 403
    assert (await user_a.post(f"/v1/tenants/{tenant_a}/users", {"name": "carol", "role": "tenant_user"})).status == 403
    assert (await user_a.get(f"/v1/tenants/{tenant_a}/users")).status == 403
    # nobody may mint a provider admin through the tenant API
    r = await admin_a.post(f"/v1/tenants/{tenant_a}/users", {"name": "mallory", "role": "provider_admin"})
    assert r.status == 422 and r.body["errors"][0]["field"] == "role"


async def test_users_of_an_unknown_tenant_are_404_for_the_provider_admin(api):
    admin = await api.admin()
    assert (await admin.get(f"/v1/tenants/{uuid.uuid4()}/users")).status == 404
    assert (await admin.post(f"/v1/tenants/{uuid.uuid4()}/users", {"name": "x", "role": "tenant_user"})).status == 404
    assert (await admin.get("/v1/tenants/not-a-uuid/users")).status == 404


async def test_tenant_and_user_creation_emit_audit_events(api, watch):
    audit = await watch("gateway.evt.>")
    tenant_id = await api.new_tenant()
    _, user = await api.new_user(tenant_id)
    await audit.wait_for(lambda i: i[1]["type"] == "gateway.tenant_created" and i[1]["data"]["tenant_id"] == tenant_id)
    hits = await audit.wait_for(lambda i: i[1]["type"] == "gateway.user_created" and i[1]["data"]["user_id"] == user["id"])
    assert hits[0][1]["data"]["role"] == "tenant_user"


async def test_health_and_metrics_share_the_api_port(api):
    for path in ("/healthz", "/readyz", "/metrics"):
        assert (await api.anonymous().get(path)).status == 200
