"""The audit trail through the gateway: every mutating operation of the committed OpenAPI document leaves a chained
record (a new route cannot skip it), the records carry who/what/when/outcome and never a secret, tenant admins
see only their tenant's records, the chain verifies and a superuser's edit is found, and a mutation that cannot be
audited is answered 500 (fail closed)."""
from __future__ import annotations

import asyncio
import json
import re
import uuid
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg

from shared.db import role_name
from tests.support.gateway import ADMIN_KEY, assert_problem

REPO = Path(__file__).resolve().parents[2]
MUTATING = ("post", "put", "patch", "delete")
_SAMPLES = {"action": "reboot", "slot": "0", "storage_class": "standard", "gpu_model": "H100", "pool": "shared"}


def _mutating_operations() -> list[tuple[str, str, str]]:
    doc = json.loads((REPO / "contracts" / "openapi.json").read_text())
    return [(m.upper(), path, op["operationId"]) for path, ops in doc["paths"].items()
            for m, op in ops.items() if m in MUTATING]


def _concrete(path: str) -> str:
    def value(m: re.Match) -> str:
        name = m.group(1)
        return str(uuid.uuid4()) if name.endswith("_id") else _SAMPLES.get(name, f"audit-{uuid.uuid4().hex[:8]}")
    return re.sub(r"\{([^}]+)\}", value, path)


async def _records(api, **where) -> list[dict]:
    terms = " AND ".join(f"{k} = ${i}" for i, k in enumerate(where, 1)) or "TRUE"
    async with api.rt.pool.acquire() as conn:
        rows = await conn.fetch(f"SELECT * FROM audit_log WHERE {terms} ORDER BY seq", *where.values())
    return [{**dict(r), "record": json.loads(r["record"]) if isinstance(r["record"], str) else r["record"]}
            for r in rows]


async def _by_agent(api, agent: str) -> list[dict]:
    async with api.rt.pool.acquire() as conn:
        rows = await conn.fetch("SELECT * FROM audit_log WHERE record->'actor'->>'user_agent' = $1 ORDER BY seq", agent)
    return [{**dict(r), "record": json.loads(r["record"]) if isinstance(r["record"], str) else r["record"]}
            for r in rows]


@asynccontextmanager
async def superuser(infra):
    conn = await asyncpg.connect(infra.admin_dsn)
    try:
        yield conn
    finally:
        await conn.close()


async def test_every_mutating_operation_of_the_contract_leaves_an_audit_record(api):
    admin, agent = await api.admin(), f"audit-coverage-{uuid.uuid4().hex}"
    operations = _mutating_operations()
    assert len(operations) >= 30
    assert {"putBudget", "deleteBudget", "putSpendCap", "deleteSpendCap"} <= {op for _, _, op in operations}
    called = {}
    for method, template, operation_id in operations:
        path = _concrete(template)
        if operation_id == "createToken":
            r = await api.anonymous().call(method, path, headers={"Authorization": "ApiKey tsk_nosuchkey",
                                                                  "User-Agent": agent})
        else:
            r = await admin.call(method, path, json_body={}, headers={"User-Agent": agent})
        called[operation_id] = (method, path, r.status)
    recorded = {rec["action"]: rec for rec in await _by_agent(api, agent)}
    missing = sorted(set(called) - set(recorded))
    assert not missing, f"mutating operations without an audit record: {missing}"
    for operation_id, (method, path, status) in called.items():
        rec = recorded[operation_id]
        assert (rec["method"], rec["path"], rec["status"]) == (method, path, status), operation_id
        assert re.fullmatch(r"[0-9a-f]{32}", rec["request_id"])
        assert rec["outcome"] == ("success" if status < 400 else "failure")


async def test_a_record_says_who_what_when_and_how_it_ended(api):
    client, tenant_id = await api.tenant_user("tenant_admin")
    agent = f"audit-fields-{uuid.uuid4().hex}"
    r = await client.post("/v1/ssh-keys", {"name": "x"}, headers={"User-Agent": agent})
    problem = assert_problem(r, 422)
    anonymous = await api.anonymous().post("/v1/tenants", {"name": "nobody"}, headers={"User-Agent": agent})
    assert_problem(anonymous, 401)
    refused, unauthenticated = await _by_agent(api, agent)
    assert refused["action"] == "addSshKey" and refused["method"] == "POST" and refused["status"] == 422
    assert str(refused["tenant_id"]) == tenant_id and refused["role"] == "tenant_admin"
    actor = refused["record"]["actor"]
    assert actor["ip"] == "127.0.0.1" and actor["type"] == "user" and re.fullmatch(r"[0-9a-f]{16}", actor["api_key_id"])
    assert refused["record"]["outcome"] == {"result": "failure", "code": 422, "reason": problem["type"]}
    assert refused["target_type"] == "ssh-keys" and refused["event_time"] <= refused["created_at"]
    assert unauthenticated["user_id"] is None and unauthenticated["record"]["actor"]["type"] == "anonymous"
    assert unauthenticated["action"] == "createTenant" and unauthenticated["status"] == 401
    assert unauthenticated["record"]["outcome"]["reason"].endswith("/unauthorized")


async def test_secrets_are_never_recorded(api):
    admin, agent = await api.admin(), f"audit-secrets-{uuid.uuid4().hex}"
    password = f"bmc-pw-{uuid.uuid4().hex}"
    node_id = str(uuid.uuid4())
    await admin.call("PUT", f"/v1/nodes/{node_id}/bmc", headers={"User-Agent": agent},
                     json_body={"url": "https://10.0.0.5", "system_id": "1", "username": "root", "password": password})
    tenant_id = await api.new_tenant()
    _, created = await api.new_user(tenant_id, "tenant_admin")
    key = created["api_key"]
    r = await api.http.post("/v1/auth/token", headers={"Authorization": f"ApiKey {key}", "User-Agent": agent})
    assert r.status == 200
    token = (await r.json())["access_token"]
    async with api.rt.pool.acquire() as conn:
        leaks = await conn.fetchval("SELECT count(*) FROM audit_log WHERE audit_log::text LIKE '%' || $1 || '%' "
                                    "OR audit_log::text LIKE '%' || $2 || '%' OR audit_log::text LIKE '%' || $3 || '%'",
                                    password, key, token)
    assert leaks == 0
    put, exchange = await _by_agent(api, agent)
    assert put["action"] == "setNodeBmc" and put["target_id"] == node_id
    body = put["record"]["request"]["body"]
    assert body is None or body["password"] == "REDACTED"
    assert exchange["action"] == "createToken" and str(exchange["user_id"]) == created["id"]
    assert exchange["record"]["actor"]["api_key_id"] and exchange["status"] == 200


async def test_a_budgets_webhook_secret_is_redacted_and_spend_caps_are_recorded(api):
    client, tenant_id = await api.tenant_user("tenant_admin")
    agent, secret = f"audit-budget-{uuid.uuid4().hex}", f"whsec-{uuid.uuid4().hex}"
    body = {"amount_minor": 5000, "currency": "USD", "thresholds": [{"percent": 90}],
            "webhook_url": "https://hooks.example.com/t", "webhook_secret": secret}
    r = await client.call("PUT", f"/v1/tenants/{tenant_id}/budget", json_body=body, headers={"User-Agent": agent})
    assert r.status == 202, r.body
    admin = await api.admin()
    cap = await admin.call("PUT", f"/v1/tenants/{tenant_id}/spend-cap", json_body={"amount_minor": 1, "currency": "USD"},
                           headers={"User-Agent": agent})
    assert cap.status == 200, cap.body
    assert (await admin.delete(f"/v1/tenants/{tenant_id}/spend-cap", headers={"User-Agent": agent})).status == 204
    async with api.rt.pool.acquire() as conn:
        leaks = await conn.fetchval("SELECT count(*) FROM audit_log WHERE audit_log::text LIKE '%' || $1 || '%'", secret)
    assert leaks == 0
    put, capped, uncapped = await _by_agent(api, agent)
    assert put["action"] == "putBudget" and str(put["tenant_id"]) == tenant_id and put["role"] == "tenant_admin"
    recorded = put["record"]["request"]["body"]
    assert recorded["webhook_secret"] == "REDACTED" and recorded["amount_minor"] == 5000
    assert recorded["webhook_url"] == "https://hooks.example.com/t"
    assert (capped["action"], capped["target_type"], str(capped["tenant_id"])) == ("putSpendCap", "tenants.spend-cap",
                                                                                  tenant_id)
    assert capped["record"]["request"]["body"] == {"amount_minor": 1, "currency": "USD"}
    assert (uncapped["action"], uncapped["status"]) == ("deleteSpendCap", 204)


async def test_tenant_admins_see_their_tenant_users_are_refused_provider_admins_see_all(api):
    (a_admin, a), (b_admin, b) = await api.tenant_user("tenant_admin"), await api.tenant_user("tenant_admin")
    user, _ = await api.new_user(a, "tenant_user")
    for client in (a_admin, b_admin):
        await client.post("/v1/ssh-keys", {"name": "bad key"})
    seen_by_a = await a_admin.get("/v1/audit?action=addSshKey&limit=100")
    assert seen_by_a.status == 200 and seen_by_a.body["items"]
    assert {i["tenant_id"] for i in seen_by_a.body["items"]} == {a}
    item = seen_by_a.body["items"][0]
    assert item["cadf"]["typeURI"] == "http://schemas.dmtf.org/cloud/audit/1.0/event" and item["cadf"]["outcome"] == "failure"
    assert item["k8s"]["apiVersion"] == "audit.k8s.io/v1" and item["k8s"]["verb"] == "create"
    assert_problem(await user.get("/v1/audit"), 403)
    assert_problem(await user.get("/v1/audit/export"), 403)
    every = await (await api.admin()).get("/v1/audit?action=addSshKey&outcome=failure&limit=100")
    assert {a, b} <= {i["tenant_id"] for i in every.body["items"]}
    assert_problem(await a_admin.get("/v1/audit?outcome=maybe"), 422, "outcome")


async def test_pages_follow_the_cursor_and_export_writes_json_lines(api):
    client, tenant_id = await api.tenant_user("tenant_admin")
    for i in range(3):
        await client.post("/v1/ssh-keys", {"name": f"bad {i}"})
    first = await client.get("/v1/audit?action=addSshKey&limit=2")
    second = await client.get(f"/v1/audit?action=addSshKey&limit=2&cursor={first.body['next_cursor']}")
    assert len(first.body["items"]) == 2 and second.body["items"] and second.body["next_cursor"] is None
    assert not {i["audit_id"] for i in first.body["items"]} & {i["audit_id"] for i in second.body["items"]}
    async with api.http.get("/v1/audit/export?action=addSshKey",
                            headers={"Authorization": f"Bearer {client.token}"}) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in (await r.text()).splitlines()]
    assert len(lines) == 3 and all(x["tenant_id"] == tenant_id and "cadf" in x and "k8s" in x for x in lines)
    assert [x["seq"] for x in lines] == sorted(x["seq"] for x in lines)


async def test_the_chain_verifies_and_a_superusers_edit_is_named_by_its_seq(api, infra):
    admin = await api.admin()
    await admin.post("/v1/tenants", {})
    ok = await admin.get("/v1/ops/audit/verify")
    assert ok.status == 200 and ok.body["ok"] and ok.body["entries"] >= 1, ok.body
    victim = (await _records(api, action="createTenant"))[-1]
    schema = api.rt.schema
    async with superuser(infra) as su:
        async with su.transaction():
            await su.execute("SET LOCAL session_replication_role = replica")
            await su.execute(f"UPDATE {schema}.audit_log SET status = 201 WHERE seq = $1", victim["seq"])
        try:
            broken = await admin.get("/v1/ops/audit/verify")
            assert broken.status == 200 and not broken.body["ok"]
            assert broken.body["first_bad_entry"]["seq"] == victim["seq"] and broken.body["bad_entries"] == [victim["seq"]]
        finally:
            async with su.transaction():
                await su.execute("SET LOCAL session_replication_role = replica")
                await su.execute(f"UPDATE {schema}.audit_log SET status = $2 WHERE seq = $1", victim["seq"],
                                 victim["status"])
    assert (await admin.get("/v1/ops/audit/verify")).body["ok"]
    tenant_user, _ = await api.tenant_user("tenant_admin")
    assert_problem(await tenant_user.get("/v1/ops/audit/verify"), 403)


async def test_the_service_role_cannot_change_the_trail(api):
    async with api.rt.pool.acquire() as conn:
        for sql in ("UPDATE audit_log SET status = 1", "DELETE FROM audit_log", "TRUNCATE audit_log"):
            try:
                await conn.execute(sql)
            except asyncpg.InsufficientPrivilegeError:
                continue
            raise AssertionError(f"{sql} was allowed")


async def test_a_mutation_that_cannot_be_audited_is_answered_500(api, infra):
    admin, name = await api.admin(), f"tenant-{uuid.uuid4().hex[:12]}"
    table = f"{api.rt.schema}.audit_log"
    async with superuser(infra) as su:
        await su.execute(f"REVOKE INSERT ON {table} FROM {role_name('gateway')}")
        try:
            r = await admin.post("/v1/tenants", {"name": name})
        finally:
            await su.execute(f"GRANT INSERT ON {table} TO {role_name('gateway')}")
    body = assert_problem(r, 500)
    assert body["type"].endswith("/audit-failed")
    assert ADMIN_KEY not in json.dumps(body)
    after = await admin.post("/v1/tenants", {"name": f"tenant-{uuid.uuid4().hex[:12]}"})
    assert after.status == 201 and (await _records(api, target_id=after.body["id"]))


async def test_concurrent_mutations_each_leave_their_own_record_on_one_chain(api):
    """Records of requests that finish together are appended together (http/audit_writer.py): none is lost or
    doubled, each carries its own request, and the chain still verifies."""
    admin = await api.admin()
    names = [f"tenant-{uuid.uuid4().hex[:12]}" for _ in range(16)]
    answers = await asyncio.gather(*(admin.post("/v1/tenants", {"name": n}) for n in names))
    assert [r.status for r in answers] == [201] * len(names)
    for r in answers:
        [record] = await _records(api, target_id=r.body["id"])
        assert (record["action"], record["status"], record["outcome"]) == ("createTenant", 201, "success")
    assert (await admin.get("/v1/ops/audit/verify")).body["ok"]


async def test_privileged_reads_are_recorded_and_ordinary_reads_are_not(api):
    """A console read (a guest may print secrets) and the bulk exports are on record like mutations, refused or
    not; listing one's allocations is not."""
    member, tenant = await api.tenant_user()
    admin = await api.admin()
    alloc = uuid.uuid4()
    exported = len(await _records(api, action="exportFocus"))
    assert_problem(await member.get(f"/v1/allocations/{alloc}/console?tail=100"), 404)
    assert (await admin.get(f"/v1/focus?period=2026-11&tenant_id={tenant}")).status == 200
    assert (await member.get("/v1/allocations")).status == 200
    [console] = [r for r in await _records(api, action="readConsole") if r["record"]["target"]["id"] == str(alloc)]
    assert (console["method"], console["status"], console["record"]["actor"]["tenant_id"]) == ("GET", 404, tenant)
    exports = (await _records(api, action="exportFocus"))[exported:]
    assert [(r["method"], r["status"], r["record"]["actor"]["role"]) for r in exports] == [("GET", 200, "provider_admin")]
    assert [r for r in await _records(api, action="listAllocations")] == []
