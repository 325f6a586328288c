"""API rate limits through the gateway (real PostgreSQL): a tenant over its write bucket is refused with 429,
Retry-After and RateLimit headers while its reads pass and other tenants are untouched; a user's flood leaves its
tenant's bucket to the other users; a provider admin's override raises one tenant's limit; two gateway replicas
draw from one bucket; a tenant's open event streams are bounded, across replicas, and a closed stream frees its
place."""
from __future__ import annotations

import asyncio
import re
import uuid

from services.gateway.settings import networks
from tests.support.gateway import ADMIN_KEY, assert_problem
from tests.support.polling import eventually

WRITE = "/v1/ssh-keys/{}"     # DELETE of a key that does not exist: a write, answered 404 without side effects
# refusals answered at once (rate_hold_refusals=0): these tests count a run of them; holding is tested on its own
TIGHT = dict(rate_tenant_write_per_s=1, rate_tenant_write_burst=3, rate_hold_refusals=0)
POLICY = re.compile(r'^"tenant";q=\d+;w=\d+, "user";q=\d+;w=\d+$')
REMAINING = re.compile(r'^"tenant";r=(\d+);t=\d+, "user";r=(\d+);t=\d+$')


async def _writes(client, n: int) -> list:
    return [await client.delete(WRITE.format(f"k-{uuid.uuid4().hex[:8]}")) for _ in range(n)]


async def test_a_tenant_over_its_write_bucket_gets_429_while_its_reads_and_other_tenants_pass(gateway):
    api = await gateway(**TIGHT)
    alice, _ = await api.tenant_user()
    bob, _ = await api.tenant_user()
    replies = await _writes(alice, 8)
    statuses = [r.status for r in replies]
    assert statuses[:3] == [404] * 3 and 429 in statuses, statuses   # the burst, then refusals (1 a second refills)
    refused = replies[statuses.index(429)]
    body = assert_problem(refused, 429)
    assert body["type"].endswith("/rate-limited") and "tenant" in body["detail"]
    assert int(refused.headers["Retry-After"]) >= 1
    assert POLICY.match(refused.headers["RateLimit-Policy"]) and '"tenant";q=3;w=3' in refused.headers["RateLimit-Policy"]
    assert REMAINING.match(refused.headers["RateLimit"]).group(1) == "0"
    assert REMAINING.match(replies[0].headers["RateLimit"]).group(1) == "2"   # also on answers that passed
    read = await alice.get("/v1/ssh-keys")
    assert read.status == 200 and POLICY.match(read.headers["RateLimit-Policy"])
    assert [r.status for r in await _writes(bob, 3)] == [404] * 3


async def test_a_users_flood_leaves_its_tenants_bucket_to_the_other_users(gateway):
    api = await gateway(rate_tenant_write_per_s=1, rate_tenant_write_burst=20, rate_user_write_per_s=1,
                        rate_user_write_burst=2, rate_hold_refusals=0)
    tenant_id = await api.new_tenant()
    (noisy, _), (quiet, _) = await api.new_user(tenant_id), await api.new_user(tenant_id)
    statuses = [r.status for r in await _writes(noisy, 15)]
    assert statuses.count(404) <= 4 and statuses.count(429) >= 11, statuses
    # the refused requests took nothing from the tenant's bucket: it still holds most of its 20
    assert [r.status for r in await _writes(quiet, 2)] == [404] * 2
    tokens = await api.scalar("SELECT tokens FROM rate_buckets WHERE scope='tenant' AND subject=$1 AND class='write'",
                              tenant_id)
    assert tokens >= 20 - 4 - 2 - 1, tokens


async def test_a_provider_override_raises_one_tenants_limit_and_deleting_it_restores_the_setting(gateway):
    api = await gateway(**TIGHT)
    admin = await api.admin()
    client, tenant_id = await api.tenant_user("tenant_admin")
    other, _ = await api.tenant_user()
    put = await admin.call("PUT", f"/v1/tenants/{tenant_id}/rate-limits",
                           json_body={"write_per_s": 100, "write_burst": 100})
    assert put.status == 200, put.body
    assert put.body["effective"]["write"] == {"per_s": 100, "burst": 100}
    assert put.body["effective"]["read"]["per_s"] > 0 and put.body["overridden"] == ["write_per_s", "write_burst"]
    assert [r.status for r in await _writes(client, 20)] == [404] * 20
    assert 429 in [r.status for r in await _writes(other, 8)]         # the others keep the setting
    seen = await client.get(f"/v1/tenants/{tenant_id}/rate-limits")     # the tenant's admin reads its own
    assert seen.status == 200 and seen.body["effective"]["write"]["burst"] == 100
    user, _ = await api.new_user(tenant_id)
    assert_problem(await user.get(f"/v1/tenants/{tenant_id}/rate-limits"), 403)
    assert_problem(await other.get(f"/v1/tenants/{tenant_id}/rate-limits"), 404)
    assert_problem(await client.call("PUT", f"/v1/tenants/{tenant_id}/rate-limits", json_body={}), 403)
    assert_problem(await admin.call("PUT", f"/v1/tenants/{tenant_id}/rate-limits", json_body={"write_burst": 0}),
                   422, "write_burst")
    assert (await admin.delete(f"/v1/tenants/{tenant_id}/rate-limits")).status == 204
    after = await admin.get(f"/v1/tenants/{tenant_id}/rate-limits")
    assert after.body["effective"]["write"] == {"per_s": 1, "burst": 3} and after.body["overridden"] == []
    assert 429 in [r.status for r in await _writes(client, 8)]


async def test_two_gateway_replicas_draw_from_one_bucket(gateway):
    first, second = await gateway(rate_tenant_write_per_s=1, rate_tenant_write_burst=4), await gateway(
        rate_tenant_write_per_s=1, rate_tenant_write_burst=4)
    assert first.rt.port != second.rt.port
    tenant_id = await first.new_tenant()
    _, user = await first.new_user(tenant_id)
    on_first, on_second = await first.login(user["api_key"]), await second.login(user["api_key"])
    statuses = []
    for i in range(10):
        statuses.append((await _writes(on_first if i % 2 else on_second, 1))[0].status)
    # per-replica buckets would pass 8 (4 each); one shared bucket passes its 4 and what refills meanwhile
    assert 4 <= statuses.count(404) <= 6 and statuses[:4] == [404] * 4, statuses


async def test_a_tenants_open_event_streams_are_bounded_across_replicas_and_a_closed_one_frees_its_place(gateway):
    settings = dict(sse_per_tenant=2, stream_poll_s=0.2)   # keepalives every 0.2 s: a closed stream is noticed soon
    first, second = await gateway(**settings), await gateway(**settings)
    tenant_id = await first.new_tenant()
    _, user = await first.new_user(tenant_id)
    a, b = await first.login(user["api_key"]), await second.login(user["api_key"])
    allocation = await a.post("/v1/allocations", {"name": "sse", "shape": "vm.1gpu"})
    assert allocation.status == 202, allocation.body
    path = f"/v1/allocations/{allocation.body['id']}/events"
    one = await first.http.get(path, headers={"Authorization": f"Bearer {a.token}"})
    two = await second.http.get(path, headers={"Authorization": f"Bearer {b.token}"})
    try:
        assert (one.status, two.status) == (200, 200)
        for client in (a, b):   # one replica each holds a place: neither has a third
            body = assert_problem(await client.get(path), 429)
            assert body["type"].endswith("/too-many-streams") and int((await client.get(path)).headers["Retry-After"]) >= 1
        other, _ = await first.tenant_user()
        mine = await other.post("/v1/allocations", {"name": "sse", "shape": "vm.1gpu"})
        async with first.http.get(f"/v1/allocations/{mine.body['id']}/events",
                                  headers={"Authorization": f"Bearer {other.token}"}) as theirs:
            assert theirs.status == 200                  # another tenant is not bounded by this one's streams
        one.close()

        async def reopened() -> int:
            async with second.http.get(path, headers={"Authorization": f"Bearer {b.token}"}) as again:
                return again.status
        await eventually(reopened, timeout=10, until=lambda s: s == 200, what="the closed stream's place to be free")
    finally:
        one.close()
        two.close()
        await asyncio.sleep(0)


async def test_an_expired_lease_of_a_dead_replica_does_not_count(gateway):
    api = await gateway(sse_per_tenant=1, stream_poll_s=0.2)
    client, tenant_id = await api.tenant_user()
    allocation = (await client.post("/v1/allocations", {"name": "sse", "shape": "vm.1gpu"})).body
    async with api.rt.pool.acquire() as conn:
        await conn.execute("INSERT INTO sse_leases (lease_id, tenant_id, expires_at) VALUES ($1, $2, now() - "
                           "interval '1 second')", uuid.uuid4(), uuid.UUID(tenant_id))
    async with api.http.get(f"/v1/allocations/{allocation['id']}/events",
                            headers={"Authorization": f"Bearer {client.token}"}) as resp:
        assert resp.status == 200
        assert await api.scalar("SELECT count(*) FROM sse_leases WHERE tenant_id=$1", uuid.UUID(tenant_id)) == 1


async def test_a_refused_flood_is_answered_from_memory_and_leaves_no_audit_rows(gateway, monkeypatch):
    """Once a bucket is empty the replica refuses without asking the database until a token is due (exact:
    tokens only come from time), and a 429 changed nothing, so it is not in the audit chain."""
    from services.gateway.http import ratelimit
    asked = []
    take = ratelimit.repo.take_member

    async def counted(*args, **kwargs):
        asked.append(1)
        return await take(*args, **kwargs)
    monkeypatch.setattr(ratelimit.repo, "take_member", counted)
    api = await gateway(rate_tenant_write_per_s=1, rate_tenant_write_burst=1, rate_hold_refusals=0)
    member, tenant = await api.tenant_user()
    statuses = [(await member.post("/v1/networks", {})).status for _ in range(6)]
    assert statuses[0] == 422 and statuses[1:] == [429] * 5, statuses     # the one token, then refusals
    assert len(asked) < len(statuses), asked          # refusals within the empty second came from memory
    async with api.rt.pool.acquire() as conn:
        recorded = await conn.fetchval("SELECT count(*) FROM audit_log WHERE tenant_id = $1 AND status = 429",
                                       uuid.UUID(tenant))
    assert recorded == 0


async def test_a_flooding_token_is_refused_before_authentication_with_the_same_429_and_revocation_still_wins(
        gateway, monkeypatch):
    """The shedder refuses a token this replica authenticated before, while its bucket is known empty, before any
    other work (no signature check, no span, no audit): the same problem and headers as the first refusal,
    counted in the HTTP metrics. A token it has not seen takes the whole path; a revoked key's token is a 401."""
    from services.gateway.http.auth import TokenIssuer
    from services.gateway.http.telemetry import REQUESTS
    verified = []
    authenticate = TokenIssuer.authenticate

    async def counted(self, token):
        verified.append(token)
        return await authenticate(self, token)
    monkeypatch.setattr(TokenIssuer, "authenticate", counted)
    api = await gateway(rate_tenant_write_per_s=1, rate_tenant_write_burst=1, rate_user_write_per_s=1,
                        rate_user_write_burst=1, rate_hold_refusals=0)
    tenant_id = await api.new_tenant()
    admin, _ = await api.new_user(tenant_id, "tenant_admin")
    member, created = await api.new_user(tenant_id)
    counter = REQUESTS.labels("gateway", "DELETE", "/v1/ssh-keys/{name}", "429")
    before = counter._value.get()
    replies = await _writes(member, 6)
    assert [r.status for r in replies] == [404] + [429] * 5, [r.status for r in replies]
    mine = [t for t in verified if t == member.token]
    assert len(mine) == 2, len(mine)          # the request that passed and the first refusal: the rest were shed
    first, shed = assert_problem(replies[1], 429), assert_problem(replies[-1], 429)
    assert {k: v for k, v in first.items() if k != "instance"} == {k: v for k, v in shed.items() if k != "instance"}
    assert shed["instance"].startswith("/v1/ssh-keys/k-")
    assert replies[-1].headers["RateLimit-Policy"] == replies[1].headers["RateLimit-Policy"]
    assert int(replies[-1].headers["Retry-After"]) >= 1 and replies[-1].content_type == "application/problem+json"
    assert counter._value.get() - before == 5
    other, _ = await api.new_user(tenant_id)              # same tenant, a token never seen: the whole path, then 429
    assert (await other.delete(WRITE.format("k-x"))).status == 429 and other.token in verified
    keys = f"/v1/tenants/{tenant_id}/users/{created['id']}/api-keys"
    [key] = (await admin.get(keys)).body["items"]
    assert (await (await api.admin()).delete(f"{keys}/{key['id']}")).status == 204   # (the tenant's bucket is empty)
    assert_problem(await member.delete(WRITE.format("k-y")), 401)   # revoked: not a 429 from memory


async def test_a_client_that_ignores_retry_after_is_answered_no_faster_than_its_bucket_fills(gateway):
    """Held refusals (nginx limit_req's delay): a refusal the replica knows from memory is answered once the bucket
    has a token again, so one client asking again at once gets about one answer per token, 429s and passes
    alternating; with the hold cap reached, the 429 is at once."""
    api = await gateway(rate_tenant_write_per_s=2, rate_tenant_write_burst=1, rate_user_write_per_s=100,
                        rate_user_write_burst=100, rate_hold_refusals=1)
    member, _ = await api.tenant_user()
    await _writes(member, 1)                                   # the burst's one token
    refused = await member.delete(WRITE.format("k-a"))        # from the database: at once
    assert refused.status == 429
    loop = asyncio.get_running_loop()
    started = loop.time()
    held = await member.delete(WRITE.format("k-b"))           # known empty: held until a token is due (0.5 s)
    waited = loop.time() - started
    assert held.status == 429 and assert_problem(held, 429)["type"].endswith("/rate-limited")
    assert waited >= 0.3, waited
    assert (await member.delete(WRITE.format("k-c"))).status == 404   # the token that came meanwhile
    await member.delete(WRITE.format("k-d"))                  # empty again (a 429 from the database)
    two = [asyncio.create_task(member.delete(WRITE.format(f"k-{c}"))) for c in "ef"]   # one held (the tenant's
    done, pending = await asyncio.wait(two, return_when=asyncio.FIRST_COMPLETED)       # one place), one at once
    assert len(done) == len(pending) == 1 and done.pop().result().status == 429
    assert (await pending.pop()).status == 429


async def test_behind_a_trusted_proxy_each_client_address_has_its_own_token_exchange_bucket_and_audit_ip(gateway):
    """TESSERA_TRUSTED_PROXIES: from the proxy (here the test's own 127.0.0.1), X-Forwarded-For names the client:
    two clients behind it do not share the token exchange's bucket, and the audit record shows the client's address."""
    api = await gateway(rate_token_per_s=1, rate_token_burst=2, rate_hold_refusals=0,
                        trusted_proxies=networks("127.0.0.1"))

    async def exchange(client: str) -> int:
        async with api.http.post("/v1/auth/token", headers={"Authorization": f"ApiKey {ADMIN_KEY}",
                                                            "X-Forwarded-For": f"6.6.6.6, {client}"}) as r:
            return r.status
    assert [await exchange("198.51.100.1") for _ in range(4)].count(429) >= 1
    assert await exchange("198.51.100.2") == 200                       # another client: a bucket of its own
    ips = await api.scalar("SELECT array_agg(DISTINCT record->'actor'->>'ip') FROM audit_log WHERE action='createToken'")
    assert {"198.51.100.1", "198.51.100.2"} <= set(ips) and "6.6.6.6" not in ips
