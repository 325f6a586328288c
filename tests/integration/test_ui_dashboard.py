"""The dashboard over a real gateway (NATS + PostgreSQL): sign-in by cookie, scoping, CSP, fragments, stream."""
from __future__ import annotations

import json
import uuid

import aiohttp

from tests.support.gateway import ADMIN_KEY, SseReader, publish


async def browser(api, key: str) -> aiohttp.ClientSession:
    """A cookie-keeping session signed in through the form (as a browser does, with its Origin)."""
    base = str(api.http._base_url)
    s = aiohttp.ClientSession(base_url=base, cookie_jar=aiohttp.CookieJar(unsafe=True))
    async with s.post("/ui/login", data={"api_key": key}, headers={"Origin": base.rstrip("/")},
                      allow_redirects=False) as r:
        assert r.status == 303 and r.headers["Location"] == "/ui/", await r.text()
        cookie = r.headers["Set-Cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/ui" in cookie
    return s


async def tenant_key(api, role: str = "tenant_user") -> tuple[str, str]:
    tenant_id = await api.new_tenant()
    r = await (await api.admin()).post(f"/v1/tenants/{tenant_id}/users", {"name": f"u-{uuid.uuid4().hex[:6]}", "role": role})
    return tenant_id, r.body["api_key"]


async def test_sign_in_needs_a_known_key_and_the_sites_own_origin(api):
    base = str(api.http._base_url).rstrip("/")
    async with api.http.post("/ui/login", data={"api_key": "nope"}, headers={"Origin": base}) as r:
        assert r.status == 401 and "Unknown or revoked" in await r.text()
        assert "default-src 'none'" in r.headers["Content-Security-Policy"]
    async with api.http.post("/ui/login", data={"api_key": ADMIN_KEY}, headers={"Origin": "https://evil.example"},
                             allow_redirects=False) as r:
        assert r.status == 403 and r.content_type == "application/problem+json"
    async with api.http.get("/ui/", allow_redirects=False) as r:   # not signed in
        assert r.status == 303 and r.headers["Location"] == "/ui/login"
    async with api.http.get("/ui/fragments/counters") as r:
        assert r.status == 401 and r.content_type == "application/problem+json"
    async with api.http.get("/v1/allocations", cookies={"tessera_ui": "x"}) as r:   # the API stays bearer-only
        assert r.status == 401


async def test_a_tenant_sees_only_its_own_and_the_operator_sees_every_tenant(api):
    alice_tenant, alice_key = await tenant_key(api, "tenant_admin")
    bob_tenant, bob_key = await tenant_key(api)
    alice, _ = await api.login(alice_key), None
    bob = await api.login(bob_key)
    mine = (await alice.post("/v1/allocations", {"name": "alice-train", "shape": "vm.2gpu"})).body
    theirs = (await bob.post("/v1/allocations", {"name": "bob-secret", "shape": "vm.2gpu"})).body
    async with await browser(api, alice_key) as s:
        for path in ("/ui/", "/ui/allocations", f"/ui/allocations/{mine['id']}", "/ui/resources", "/ui/billing",
                     "/ui/audit", "/ui/fragments/events", "/ui/fragments/allocations"):
            async with s.get(path) as r:
                text = await r.text()
                assert r.status == 200, (path, text)
                assert "bob-secret" not in text and theirs["id"] not in text and bob_tenant not in text, path
        async with s.get(f"/ui/allocations/{theirs['id']}") as r:
            assert r.status == 404
        async with s.get("/ui/fragments/fleet") as r:
            assert r.status == 403 and r.content_type == "application/problem+json"
        async with s.get(f"/ui/fragments/console?id={mine['id']}") as r:   # not ACTIVE yet: no node to ask
            assert r.status == 200 and "while the allocation is ACTIVE" in await r.text()
        async with s.get(f"/ui/fragments/console?id={theirs['id']}") as r:
            assert r.status == 404 and r.content_type == "application/problem+json"
        async with s.get("/ui/") as r:
            assert "alice-train" in await r.text()
    async with await browser(api, bob_key) as s, s.get("/ui/audit") as r:   # a tenant user: no audit trail
        assert r.status == 403
    async with await browser(api, ADMIN_KEY) as s:
        async with s.get("/ui/allocations?") as r:
            text = await r.text()
            assert "alice-train" in text and "bob-secret" in text
        async with s.get("/ui/") as r:
            text = await r.text()
            assert r.status == 200 and "Fleet" in text and "dead letters" in text, text
        async with s.get(f"/ui/nodes/{uuid.uuid4()}") as r:
            assert r.status == 404
        async with s.get(f"/ui/fragments/console?id={mine['id']}") as r:   # the console is the tenant's
            assert r.status == 403
        async with s.get("/ui/data/latency.json") as r:
            assert r.status == 200 and "times" in await r.json()
        async with s.get("/ui/static/app.js") as r:
            assert r.status == 200 and "Content-Security-Policy" in r.headers
        async with s.post("/ui/logout", headers={"Origin": str(api.http._base_url).rstrip("/")},
                          allow_redirects=False) as r:
            assert r.status == 303
        async with s.get("/ui/", allow_redirects=False) as r:
            assert r.status == 303


async def test_the_stream_tells_the_page_of_its_tenants_events_only(api, nc):
    tenant_id, key = await tenant_key(api)
    _, other_key = await tenant_key(api)
    client, other = await api.login(key), await api.login(other_key)
    a = (await client.post("/v1/allocations", {"name": "live", "shape": "vm.2gpu"})).body
    b = (await other.post("/v1/allocations", {"name": "other", "shape": "vm.2gpu"})).body
    async with await browser(api, key) as s, s.get("/ui/stream") as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
        sse = SseReader(resp)
        for x in (b, a):
            await publish(nc, "allocation.command_rejected", {"allocation_id": x["id"], "command": "allocation.release",
                                                              "reason": "the allocation is REQUESTED"}, x["tenant_id"])
        got = await sse.next_event()
        assert got["event"] == "allocation" and json.loads(got["data"])["allocation_id"] == a["id"]
    assert tenant_id == a["tenant_id"]
