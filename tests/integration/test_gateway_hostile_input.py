"""A hostile tenant and a careless admin against the running gateway: input nothing downstream can handle is refused
at the boundary with a problem document naming the limit or the field, and writes nothing; aiohttp's own refusals of
unparsable requests are problem documents too; the server enforces what the OpenAPI document states."""
from __future__ import annotations

import asyncio
import json
import uuid

import jsonschema
import pytest

from services.gateway.entrypoints.openapi import document
from services.gateway.http.inputs import MAX_JSON_DEPTH
from tests.support.gateway import ADMIN_KEY


def assert_problem(r, status: int, field: str | None = None) -> dict:
    assert r.status == status, (r.status, r.body)
    assert r.content_type == "application/problem+json", r.headers
    assert {"type", "title", "status", "detail"} <= r.body.keys() and r.body["status"] == status, r.body
    if field is not None:
        assert field in [e["field"] for e in r.body["errors"]], r.body
    return r.body


async def outbox_total(api) -> int:
    return await api.scalar("SELECT count(*) FROM outbox")


# --- JSON nested too deeply -------------------------------------------------------------------------------------

@pytest.mark.parametrize("path,role", [("/v1/allocations", "tenant"), ("/v1/networks", "tenant"), ("/v1/tenants", "admin")])
async def test_json_nested_deeper_than_the_limit_is_a_400_naming_it_on_every_body(api, path, role):
    client = (await api.tenant_user())[0] if role == "tenant" else await api.admin()
    before = await outbox_total(api)
    for raw in ("[" * 5000 + "]" * 5000, '{"name": ' + "[" * 1500 + "]" * 1500 + "}", "{" * 30000):
        r = await client.call("POST", path, data=raw.encode(), headers={"Content-Type": "application/json"})
        body = assert_problem(r, 400)
        assert body["detail"] == f"JSON nesting deeper than {MAX_JSON_DEPTH} levels"
    # at the limit it is parsed, and refused for what it is
    at_limit = '{"name": ' + "[" * (MAX_JSON_DEPTH - 1) + "]" * (MAX_JSON_DEPTH - 1) + "}"
    r = await client.call("POST", path, data=at_limit.encode(), headers={"Content-Type": "application/json"})
    assert_problem(r, 422, "name")
    assert await outbox_total(api) == before


# --- strings PostgreSQL cannot store, and control characters ------------------------------------------------------

async def test_nul_and_control_characters_in_a_body_are_422_naming_the_field_and_write_nothing(api):
    tenant, tenant_id = await api.tenant_user("tenant_admin")
    admin = await api.admin()
    node = {"name": f"n-{uuid.uuid4().hex[:8]}", "gpu_model": "H100", "gpu_count": 8}
    cases = [   # (client, method, path, body, field): the 500s and the 202s the fuzzer found, and their kin
        (tenant, "POST", "/v1/allocations", {"name": "a", "shape": "vm.1gpu", "labels": {"team": "ml\u0000x"}}, "labels.team"),
        (tenant, "POST", "/v1/allocations", {"name": "a", "shape": "vm.1gpu", "labels": {"te\u007fam": "ml"}}, None),
        (tenant, "POST", "/v1/allocations", {"name": "a", "shape": "vm.1gpu", "tolerations": ["a=b:NoSchedule\u0000"]},
         "tolerations.0"),
        (tenant, "POST", "/v1/networks", {"name": "net", "cidr": "10.7.0.0/24\u0000"}, "cidr"),
        (admin, "POST", "/v1/nodes", {**node, "gpu_model": "H\u0000100"}, "gpu_model"),
        (admin, "POST", "/v1/nodes", {**node, "region": "eu\u0000"}, "region"),
        (admin, "POST", "/v1/nodes", {**node, "rack": "r\u001b[2J"}, "rack"),
        (admin, "POST", "/v1/nodes", {**node, "site": "fra\u0085"}, "site"),
        (admin, "PUT", "/v1/pools/gpu", {"description": "fast\u0000pool"}, "description"),
        (admin, "PUT", "/v1/pools/gpu", {"description": "fast\u007fpool"}, "description"),
        (admin, "POST", "/v1/tenants", {"name": "Acme\u0000"}, "name"),
        (admin, "POST", f"/v1/tenants/{tenant_id}/users", {"name": "ada\u0001", "role": "tenant_user"}, "name"),
    ]
    before = (await outbox_total(api), await api.scalar("SELECT count(*) FROM nodes_view"),
              await api.scalar("SELECT count(*) FROM allocations_view WHERE tenant_id=$1", uuid.UUID(tenant_id)))
    for client, method, path, body, field in cases:
        r = await client.call(method, path, json_body=body)
        problem = assert_problem(r, 422, field)
        assert "\u0000" not in json.dumps(problem, ensure_ascii=False), problem    # nothing echoed raw
    after = (await outbox_total(api), await api.scalar("SELECT count(*) FROM nodes_view"),
             await api.scalar("SELECT count(*) FROM allocations_view WHERE tenant_id=$1", uuid.UUID(tenant_id)))
    assert after == before


async def test_a_lone_surrogate_is_422_naming_the_field(api):
    admin = await api.admin()
    raw = b'{"gpu_model": "H100", "gpu_count": 8, "name": "n1", "labels": {"k": "\\ud800"}}'
    r = await admin.call("POST", "/v1/nodes", data=raw, headers={"Content-Type": "application/json"})
    assert_problem(r, 422, "labels.k")


async def test_multi_line_text_keeps_its_lines(api):
    admin = await api.admin()
    r = await admin.call("PUT", f"/v1/pools/p-{uuid.uuid4().hex[:6]}", json_body={"description": "line one\n\tline two"})
    assert r.status == 202 and r.body["description"] == "line one\n\tline two"


async def test_path_and_query_values_are_validated_like_body_fields(api):
    admin = await api.admin()
    tenant, tenant_id = await api.tenant_user()
    assert_problem(await admin.call("PUT", "/v1/pools/gpu%00pool", json_body={}), 422, "name")
    assert_problem(await admin.call("PUT", "/v1/pools/gpu%0A", json_body={}), 422, "name")
    assert_problem(await admin.call("PUT", f"/v1/tenants/{tenant_id}/quotas/shared/H%00100", json_body={"limit": 1}),
                   422, "gpu_model")
    assert_problem(await tenant.get("/v1/allocations?cursor=%00"), 422, "cursor")
    assert_problem(await tenant.get("/v1/allocations?cursor=garbage"), 422, "cursor")
    assert (await tenant.get(f"/v1/allocations?cursor=1700000000000000-{uuid.uuid4().hex}")).status == 200
    assert (await admin.get(f"/v1/nodes/{uuid.uuid4().hex}")).status == 404      # not the 8-4-4-4-12 form


async def test_repeated_empty_or_non_integer_query_parameters_are_422(api):
    admin = await api.admin()
    tenant, _ = await api.tenant_user()
    for client, path in ((admin, "/v1/ops/dead-letters"), (tenant, "/v1/allocations")):
        for query in ("limit=&limit=junk", "limit=5&limit=5", "limit=", "limit=junk", "limit=10.0", "limit=+5",
                      "limit=0", "limit=100000"):
            assert_problem(await client.get(f"{path}?{query}"), 422, "limit")
        assert (await client.get(f"{path}?limit=5")).status == 200
        assert (await client.get(path)).status == 200


async def test_an_integer_field_takes_a_json_number_without_fraction(api):
    tenant, _ = await api.tenant_user()
    r = await tenant.call("POST", "/v1/allocations", data=b'{"name": "i", "shape": "vm.1gpu", "volume_gb": 10.0}',
                          headers={"Content-Type": "application/json"})
    assert r.status == 202 and r.body["volume_gb"] == 10
    for raw in (b"10.5", b'"10"', b"true", b"1e400"):
        r = await tenant.call("POST", "/v1/allocations", data=b'{"name": "i", "shape": "vm.1gpu", "volume_gb": ' + raw + b"}",
                              headers={"Content-Type": "application/json"})
        assert_problem(r, 422, "volume_gb")


async def test_a_node_change_cannot_be_null_or_empty_as_the_document_says(api):
    admin = await api.admin()
    node = await admin.post("/v1/nodes", {"name": f"n-{uuid.uuid4().hex[:8]}", "gpu_model": "H100", "gpu_count": 8})
    path = f"/v1/nodes/{node.body['id']}"
    for body, field in (({"pool": None}, "pool"), ({"cordoned": True, "labels": None}, "labels"), ({}, "body"),
                        ({"reason": "nothing else"}, "body")):
        assert_problem(await admin.call("PATCH", path, json_body=body), 422, field)
    assert (await admin.call("PATCH", path, json_body={"cordoned": True})).status == 202


async def test_a_quota_guarantee_above_its_limit_is_422_naming_it(api):
    admin = await api.admin()
    tenant_id = await api.new_tenant()
    r = await admin.call("PUT", f"/v1/tenants/{tenant_id}/quotas/shared/H100", json_body={"limit": 2, "guaranteed": 3})
    assert_problem(r, 422, "guaranteed")


def _matches_documented_schema(status: int, path: str, method: str, body: dict) -> None:
    doc = document()
    schema = doc["paths"][path][method]["responses"][str(status)]["content"]["application/problem+json"]["schema"]
    jsonschema.Draft202012Validator({**schema, "components": doc["components"]}).validate(body)


async def test_a_conflicting_slot_map_approval_answers_the_documented_problem(api):
    admin = await api.admin()
    node = await admin.post("/v1/nodes", {"name": f"n-{uuid.uuid4().hex[:8]}", "gpu_model": "H100", "gpu_count": 8})
    r = await admin.post(f"/v1/nodes/{node.body['id']}/approve", {"proposal": 1})
    body = assert_problem(r, 409)
    assert body["node_status"] == "registering" and body["current_proposal"] is None
    _matches_documented_schema(409, "/v1/nodes/{node_id}/approve", "post", body)


# --- aiohttp's own refusals -----------------------------------------------------------------------------------------

async def _raw(port: int, request: bytes) -> tuple[int, dict, dict]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), 10)    # the server closes the connection after such an answer
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, json.loads(body)


@pytest.mark.parametrize("request_bytes", [
    b"GET /v1/" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",                               # request line too long
    b"GET /v1/shapes HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n",                # header too long
    b"GET /v1/shapes HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(200)) + b"\r\n",
    b"G\x01T /v1/shapes HTTP/1.1\r\nHost: x\r\n\r\n",                                            # not a method
    b"GET /v1/shapes HTTP/1.1\r\nHost: x\r\nBad Header: y\r\n\r\n",                              # not a header
    b"POST /v1/tenants HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",   # bad chunk
    b"GET /v1/shapes HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
], ids=["request-line", "header-field", "too-many-headers", "method", "header-syntax", "chunk", "content-length"])
async def test_requests_aiohttp_cannot_parse_are_answered_with_problem_documents(api, request_bytes):
    status, headers, body = await _raw(api.rt.port, request_bytes)
    assert status == 400 and headers["Content-Type"].startswith("application/problem+json"), (status, headers)
    assert {"type", "title", "status", "detail"} <= body.keys() and body["status"] == 400
    assert "aaaa" not in body["detail"]     # the raw input is not echoed


async def test_a_credential_that_is_not_visible_ascii_is_a_401_not_a_500(api):
    for header in (b"Authorization: ApiKey tsk_\xff\xfe", b"Authorization: Bearer \xc3\xa9t\xc3\xa9"):
        path = b"/v1/auth/token" if b"ApiKey" in header else b"/v1/tenants"
        method = b"POST" if b"ApiKey" in header else b"GET"
        status, headers, body = await _raw(api.rt.port, method + b" " + path + b" HTTP/1.1\r\nHost: x\r\n" + header
                                           + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        assert status == 401 and headers["Content-Type"].startswith("application/problem+json") and body["status"] == 401
    assert (await api.login(ADMIN_KEY)).token


async def test_an_error_past_every_middleware_is_a_500_problem_too():
    """aiohttp renders an exception no middleware caught itself (text/plain); on the gateway's server it is a problem."""
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    from services.gateway.http.lowlevel import answer_parser_errors_with_problems

    async def broken(_request):
        raise RuntimeError("password=hunter2")

    app = web.Application()
    app.router.add_get("/boom", broken)
    answer_parser_errors_with_problems(app)
    async with TestClient(TestServer(app)) as client:
        r = await client.get("/boom")
        text = await r.text()
        assert r.status == 500 and r.content_type == "application/problem+json" and "hunter2" not in text
        assert (await r.json())["status"] == 500
        status, headers, body = await _raw(client.port, b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == 400 and headers["Content-Type"].startswith("application/problem+json") and body["status"] == 400
