"""Before and after in the audit trail: a successful update or delete records the target's state as the gateway
showed it just before and just after the request (a synchronous change: the new state; an asynchronous one: the
state the owning service's event later brings is the next request's before), a refused one records none, and no
secret is ever among the states."""
from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from types import SimpleNamespace

from services.gateway.entrypoints.http import STATE_READERS
from tests.support.gateway import assert_problem, node_doc, project

REPO = Path(__file__).resolve().parents[2]

PEM = "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUQ0FU\n-----END CERTIFICATE-----\n"


async def _by_agent(api, agent: str) -> list[dict]:
    async with api.rt.pool.acquire() as conn:
        rows = await conn.fetch("SELECT * FROM audit_log WHERE record->'actor'->>'user_agent' = $1 ORDER BY seq", agent)
    return [{**dict(r), "record": json.loads(r["record"]) if isinstance(r["record"], str) else r["record"]}
            for r in rows]


async def test_every_state_reader_runs_against_the_schema_and_finds_nothing_for_an_unknown_target(api):
    """Each reader's SELECT is valid on the migrated schema (a renamed column fails here, not in production)."""
    doc = json.loads((REPO / "contracts" / "openapi.json").read_text())
    templates = {op["operationId"]: path for path, ops in doc["paths"].items() for op in ops.values()}
    caller = SimpleNamespace(user_id=uuid.uuid4())
    async with api.rt.pool.acquire() as conn:
        for operation_id, reader in STATE_READERS.items():
            params = {name: str(uuid.uuid4()) if name.endswith("_id") else f"audit-{uuid.uuid4().hex[:8]}"
                      for name in re.findall(r"\{([^}]+)\}", templates[operation_id])}
            assert await reader(conn, params, caller) is None, operation_id
            assert await reader(conn, {k: "not-a-uuid" for k in params}, None) is None, operation_id


def _amounts(change: dict) -> tuple:
    return tuple(s and (s["amount_minor"], s["currency"]) for s in (change["before"], change["after"]))


async def test_a_spend_cap_set_changed_and_removed_records_each_state_before_and_after(api):
    admin, tenant_id = await api.admin(), await api.new_tenant()
    h = {"User-Agent": f"audit-change-{uuid.uuid4().hex}"}
    cap = f"/v1/tenants/{tenant_id}/spend-cap"
    assert (await admin.call("PUT", cap, json_body={"amount_minor": 100, "currency": "USD"}, headers=h)).status == 200
    assert (await admin.call("PUT", cap, json_body={"amount_minor": 250, "currency": "USD"}, headers=h)).status == 200
    assert (await admin.delete(cap, headers=h)).status == 204
    first, second, removed = await _by_agent(api, h["User-Agent"])
    assert _amounts(first["record"]["change"]) == (None, (100, "USD"))
    assert _amounts(second["record"]["change"]) == ((100, "USD"), (250, "USD"))
    assert second["record"]["change"]["before"] == first["record"]["change"]["after"]
    assert _amounts(removed["record"]["change"]) == ((250, "USD"), None)
    assert removed["record"]["level"] == "RequestResponse"
    seen = await admin.get(f"/v1/audit?action=deleteSpendCap&target_id={tenant_id}")
    [item] = seen.body["items"]
    assert item["k8s"]["responseObject"]["after"] is None and item["k8s"]["level"] == "RequestResponse"
    assert item["cadf"]["attachments"][0]["name"] == "change"


async def test_a_quota_set_twice_shows_the_projected_state_as_the_next_before(api, nc):
    admin, tenant_id = await api.admin(), await api.new_tenant()
    agent = f"audit-quota-{uuid.uuid4().hex}"
    path = f"/v1/tenants/{tenant_id}/quotas/shared/H100"
    r = await admin.call("PUT", path, json_body={"limit": 8}, headers={"User-Agent": agent})
    assert r.status == 202, r.body
    await project(api, nc, "scheduler.quota_changed", {"tenant_id": tenant_id, "gpu_model": "H100", "pool": "shared",
                                                       "user_id": None, "limit": 8, "guaranteed": 0, "used": 0,
                                                       "version": 1})
    r = await admin.call("PUT", path, json_body={"limit": 4}, headers={"User-Agent": agent})
    assert r.status == 202, r.body
    first, second = await _by_agent(api, agent)
    # asynchronous: the scheduler had not answered when the first was recorded, so its after is still its before
    assert first["record"]["change"] == {"before": None, "after": None}
    assert first["record"]["request"]["body"] == {"limit": 8}
    before = second["record"]["change"]["before"]
    assert (before["limit"], before["guaranteed"], before["version"]) == (8, 0, 1)
    assert second["record"]["request"]["body"] == {"limit": 4}


async def test_a_node_cordoned_through_update_node_records_its_document(api, nc):
    admin, agent = await api.admin(), f"audit-node-{uuid.uuid4().hex}"
    node_id, name = str(uuid.uuid4()), f"node-{uuid.uuid4().hex[:8]}"
    await project(api, nc, "scheduler.node_changed", node_doc(node_id, name, 1, status="schedulable", proposal=None))
    r = await admin.call("PATCH", f"/v1/nodes/{node_id}", json_body={"cordoned": True}, headers={"User-Agent": agent})
    assert r.status == 202, r.body
    await project(api, nc, "scheduler.node_changed", node_doc(node_id, name, 2, status="schedulable", proposal=None,
                                                             cordoned=True))
    r = await admin.call("PATCH", f"/v1/nodes/{node_id}", json_body={"cordoned": False}, headers={"User-Agent": agent})
    assert r.status == 202, r.body
    cordon, uncordon = await _by_agent(api, agent)
    before = cordon["record"]["change"]["before"]
    assert (before["name"], before["status"], before["cordoned"], before["labels"]) == (name, "schedulable", False,
                                                                                      {"hw": "hgx"})
    assert uncordon["record"]["change"]["before"]["cordoned"] is True
    assert uncordon["record"]["change"]["before"]["version"] == 2


async def test_a_refused_update_records_no_state(api):
    admin = await api.admin()
    (member, a), (_, b) = await api.tenant_user("tenant_admin"), await api.tenant_user("tenant_admin")
    agent = f"audit-refused-{uuid.uuid4().hex}"
    assert (await admin.call("PUT", f"/v1/tenants/{b}/spend-cap", json_body={"amount_minor": 7, "currency": "USD"})
            ).status == 200
    refused = await member.call("PUT", f"/v1/tenants/{b}/spend-cap", json_body={"amount_minor": 0, "currency": "USD"},
                                headers={"User-Agent": agent})
    assert_problem(refused, 403)
    missing = await admin.call("PUT", f"/v1/tenants/{uuid.uuid4()}/spend-cap",
                               json_body={"amount_minor": 1, "currency": "USD"}, headers={"User-Agent": agent})
    assert_problem(missing, 404)
    records = await _by_agent(api, agent)
    assert [(r["status"], "change" in r["record"]) for r in records] == [(403, False), (404, False)]
    assert str(records[0]["tenant_id"]) == a


async def test_no_bmc_secret_is_among_the_states(api):
    admin, agent = await api.admin(), f"audit-bmc-{uuid.uuid4().hex}"
    r = await admin.post("/v1/nodes", {"name": f"bm-{uuid.uuid4().hex[:8]}", "gpu_model": "H100", "gpu_count": 8})
    assert r.status == 202, r.body
    node, password = r.body["id"], f"calvin-{uuid.uuid4().hex}"
    body = {"url": "https://10.20.0.5", "system_id": "/redfish/v1/Systems/1", "username": "root", "password": password,
            "verify_tls": True, "ca_bundle": PEM}
    assert (await admin.call("PUT", f"/v1/nodes/{node}/bmc", json_body=body, headers={"User-Agent": agent})).status == 200
    assert (await admin.delete(f"/v1/nodes/{node}/bmc", headers={"User-Agent": agent})).status in (200, 204)
    async with api.rt.pool.acquire() as conn:
        sealed = await conn.fetchval("SELECT password_sealed FROM node_bmcs WHERE node_id = $1", uuid.UUID(node))
        leaks = await conn.fetchval("SELECT count(*) FROM audit_log WHERE record::text LIKE '%' || $1 || '%'", password)
    assert leaks == 0
    put, removed = await _by_agent(api, agent)
    assert put["record"]["change"]["before"] is None
    after = put["record"]["change"]["after"]
    assert (after["url"], after["username"], after["version"]) == ("https://10.20.0.5", "root", 1)
    assert not {"password", "password_sealed", "ca_bundle"} & after.keys()
    assert removed["record"]["change"]["before"] == after and removed["record"]["change"]["after"] is None
    assert sealed is None or sealed not in json.dumps(put["record"])


async def test_a_state_that_cannot_be_read_never_fails_the_request(api, monkeypatch):
    from services.gateway.entrypoints import http as audit_state

    async def broken(conn, params, principal):
        raise TimeoutError("the view is locked")
    monkeypatch.setitem(audit_state.STATE_READERS, "putSpendCap", broken)
    admin, tenant_id = await api.admin(), await api.new_tenant()
    agent = f"audit-unreadable-{uuid.uuid4().hex}"
    r = await admin.call("PUT", f"/v1/tenants/{tenant_id}/spend-cap", json_body={"amount_minor": 3, "currency": "USD"},
                         headers={"User-Agent": agent})
    assert r.status == 200, r.body
    [record] = await _by_agent(api, agent)
    assert record["record"]["change"] == {"error": "TimeoutError"} and record["outcome"] == "success"
