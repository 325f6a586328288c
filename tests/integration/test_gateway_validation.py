"""Malformed input gets the right problem (status, application/problem+json, fields named) and creates nothing."""
from __future__ import annotations

import json
import uuid

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from services.gateway.http.problems import problems_middleware

GOOD = {"name": "ok", "shape": "vm.1gpu"}
BIG = json.dumps({"name": "big", "shape": "vm.1gpu", "labels": {"x": "y" * 200}, "pad": "z" * (70 * 1024)})

# (id, raw body or json, content type, expected status, field the problem must name or None)
CASES = [
    ("bad-json", b'{"name": "x", "shape": ', "application/json", 400, None),
    ("nan-is-not-json", b'{"name": "x", "shape": "vm.1gpu", "volume_gb": NaN}', "application/json", 400, None),
    ("empty-body", b"", "application/json", 400, None),
    ("not-an-object", json.dumps(["name", "x"]), "application/json", 422, "body"),
    ("wrong-type-volume", json.dumps({**GOOD, "volume_gb": "10"}), "application/json", 422, "volume_gb"),
    ("bool-is-not-int", json.dumps({**GOOD, "volume_gb": True}), "application/json", 422, "volume_gb"),
    ("negative-volume", json.dumps({**GOOD, "volume_gb": -1}), "application/json", 422, "volume_gb"),
    ("unknown-shape", json.dumps({**GOOD, "shape": "vm.3gpu"}), "application/json", 422, "shape"),
    ("missing-name", json.dumps({"shape": "vm.1gpu"}), "application/json", 422, "name"),
    ("bad-name", json.dumps({**GOOD, "name": "has spaces"}), "application/json", 422, "name"),
    ("unknown-field", json.dumps({**GOOD, "colour": "red"}), "application/json", 422, "colour"),
    ("label-not-string", json.dumps({**GOOD, "labels": {"a": 1}}), "application/json", 422, "labels.a"),
    ("too-many-labels", json.dumps({**GOOD, "labels": {f"k{i}": "v" for i in range(33)}}), "application/json", 422, "labels"),
    ("server-owned-id", json.dumps({**GOOD, "id": str(uuid.uuid4())}), "application/json", 422, "id"),
    ("server-owned-tenant", json.dumps({**GOOD, "tenant_id": str(uuid.uuid4())}), "application/json", 422, "tenant_id"),
    ("server-owned-state", json.dumps({**GOOD, "state": "ACTIVE"}), "application/json", 422, "state"),
    ("server-owned-price", json.dumps({**GOOD, "price": 0}), "application/json", 422, "price"),
    ("server-owned-gpu-count", json.dumps({**GOOD, "gpu_count": 8}), "application/json", 422, "gpu_count"),
    ("server-owned-created", json.dumps({**GOOD, "created_at": "2030-01-01T00:00:00Z"}), "application/json", 422, "created_at"),
    ("server-owned-user", json.dumps({**GOOD, "user_id": str(uuid.uuid4())}), "application/json", 422, "user_id"),
    ("server-owned-node", json.dumps({**GOOD, "node_id": str(uuid.uuid4())}), "application/json", 422, "node_id"),
    ("too-large", BIG, "application/json", 413, None),
    ("form-encoded", "name=x&shape=vm.1gpu", "application/x-www-form-urlencoded", 415, None),
    ("text-plain", json.dumps(GOOD), "text/plain", 415, None),
    ("no-content-type", json.dumps(GOOD).encode(), None, 415, None),
]


async def _state(api, tenant_id: str) -> tuple[int, int]:
    rows = await api.scalar("SELECT count(*) FROM allocations_view WHERE tenant_id=$1", uuid.UUID(tenant_id))
    return rows, await api.commands_of("allocation.request", tenant_id)


async def test_every_malformed_allocation_request_is_refused_with_a_problem_and_creates_nothing(api, watch):
    client, tenant_id = await api.tenant_user()
    commands = await watch("allocation.cmd.request")
    before = await _state(api, tenant_id)
    for case, raw, ctype, status, field in CASES:
        headers = {"Content-Type": ctype} if ctype else {}
        r = await client.call("POST", "/v1/allocations", data=raw, headers=headers)
        assert r.status == status, (case, r.status, r.body)
        assert r.content_type == "application/problem+json", case
        assert {"type", "title", "status", "detail"} <= r.body.keys() and r.body["status"] == status, case
        if field is not None:
            assert field in {e["field"] for e in r.body["errors"]}, (case, r.body["errors"])
        if case.startswith("server-owned"):
            assert "server-owned" in r.body["detail"] and r.body["errors"][0]["code"] == "server_owned", case
    assert await _state(api, tenant_id) == before == (0, 0)
    # a good request afterwards is the first and only command of this tenant on the stream (the relay keeps order)
    ok = await client.post("/v1/allocations", GOOD)
    assert ok.status == 202
    await commands.wait_for(lambda i: i[1]["tenant_id"] == tenant_id)
    assert [i[1]["data"]["allocation_id"] for i in commands.items if i[1]["tenant_id"] == tenant_id] == [ok.body["id"]]


async def test_idempotency_key_that_is_too_long_is_422_and_creates_nothing(api):
    client, tenant_id = await api.tenant_user()
    r = await client.post("/v1/allocations", GOOD, headers={"Idempotency-Key": "k" * 256})
    assert r.status == 422 and r.body["errors"][0]["field"] == "Idempotency-Key"
    assert await _state(api, tenant_id) == (0, 0)


@pytest.mark.parametrize("path,payload,field", [
    ("/v1/tenants", {"name": "t", "id": str(uuid.uuid4())}, "id"),
    ("/v1/tenants", {"name": 5}, "name"),
    ("/v1/nodes", {"name": "n", "gpu_model": "H100", "gpu_count": 0}, "gpu_count"),
    ("/v1/nodes", {"name": "n", "gpu_model": "H100", "gpu_count": 8, "status": "registered"}, "status"),
    ("/v1/nodes", {"name": "n", "gpu_model": "H100", "gpu_count": 8, "extra": 1}, "extra"),
])
async def test_admin_endpoints_validate_bodies_the_same_way(api, path, payload, field):
    admin = await api.admin()
    tenants_before = await api.scalar("SELECT count(*) FROM tenants")
    nodes_before = await api.scalar("SELECT count(*) FROM nodes_view")
    r = await admin.post(path, payload)
    assert r.status == 422 and r.content_type == "application/problem+json"
    assert field in {e["field"] for e in r.body["errors"]}
    assert await api.scalar("SELECT count(*) FROM tenants") == tenants_before
    assert await api.scalar("SELECT count(*) FROM nodes_view") == nodes_before


async def test_user_bodies_refuse_server_owned_fields_and_create_no_user(api):
    admin = await api.admin()
    tenant_id = await api.new_tenant()
    r = await admin.post(f"/v1/tenants/{tenant_id}/users", {"name": "u", "role": "tenant_user", "api_key": "tsk_mine"})
    assert r.status == 422 and r.body["errors"][0] == {"field": "api_key", "code": "server_owned",
                                                         "message": r.body["errors"][0]["message"]}
    assert await api.scalar("SELECT count(*) FROM users WHERE tenant_id=$1", uuid.UUID(tenant_id)) == 0


async def test_unknown_routes_and_methods_answer_problems(api):
    client, _ = await api.tenant_user()
    r = await client.get("/v1/nothing-here")
    assert r.status == 404 and r.content_type == "application/problem+json"
    r = await client.call("PUT", "/v1/allocations")
    assert r.status == 405 and r.content_type == "application/problem+json"
    assert "GET" in r.headers.get("Allow", "")


async def test_chunked_body_over_64_kib_is_413_and_creates_nothing(api):
    client, tenant_id = await api.tenant_user()

    async def chunks():
        yield b'{"name": "big", "shape": "vm.1gpu", "pad": "'
        for _ in range(80):
            yield b"z" * 1024
        yield b'"}'

    r = await client.call("POST", "/v1/allocations", data=chunks(), headers={"Content-Type": "application/json"})
    assert r.status == 413 and r.content_type == "application/problem+json"
    assert await _state(api, tenant_id) == (0, 0)


async def test_an_unexpected_error_is_a_500_problem_that_reveals_no_internals():
    async def broken(_request):
        raise RuntimeError("password=hunter2 at /srv/secret.py line 3")

    app = web.Application(middlewares=[problems_middleware])
    app.router.add_get("/boom", broken)
    async with TestClient(TestServer(app)) as client:
        r = await client.get("/boom")
        text = await r.text()
        assert r.status == 500 and r.content_type == "application/problem+json"
        assert "hunter2" not in text and "secret" not in text and "RuntimeError" not in text
        assert (await r.json())["status"] == 500
