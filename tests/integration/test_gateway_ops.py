"""Operator endpoints (dead letters, live stream feed), the served OpenAPI document, and clean shutdown."""
from __future__ import annotations

import asyncio
import json
import uuid
from functools import partial
from pathlib import Path

import aiohttp

from services.gateway.bootstrap import build
from shared.settings import BusSettings, ServiceSettings
from tests.support.gateway import ADMIN_KEY, Api, SseReader, gateway_config
from tests.support.polling import eventually

REPO = Path(__file__).resolve().parents[2]


async def test_served_openapi_document_equals_the_committed_contract(api):
    r = await api.anonymous().get("/openapi.json")
    assert r.status == 200 and r.content_type == "application/json"
    committed = json.loads((REPO / "contracts" / "openapi.json").read_text())
    assert r.body == committed, "regenerate: python -m services.gateway.entrypoints.openapi > contracts/openapi.json"
    assert r.body["openapi"].startswith("3.1")


async def test_dead_letters_lists_the_newest_with_their_dlq_headers_and_decoded_body(api, nc):
    admin = await api.admin()
    marker = str(uuid.uuid4())
    # not an envelope: the gateway's consumer cannot parse it and dead-letters it at once
    await nc.jetstream().publish("allocation.evt.activated", json.dumps({"marker": marker}).encode())

    async def listed():
        r = await admin.get("/v1/ops/dead-letters?limit=50")
        assert r.status == 200
        return [i for i in r.body["items"] if isinstance(i["body"], dict) and i["body"].get("marker") == marker
                and i["headers"].get("Tessera-DLQ-Consumer") == "gateway__allocation_activated"]
    item = (await eventually(listed, timeout=15))[0]
    assert item["headers"]["Tessera-DLQ-Reason"] == "invalid"
    assert item["headers"]["Tessera-DLQ-Subject"] == "allocation.evt.activated"
    assert all(k.startswith("Tessera-DLQ-") for k in item["headers"])
    newest = await admin.get("/v1/ops/dead-letters?limit=1")
    assert len(newest.body["items"]) == 1 and newest.body["items"][0]["seq"] >= item["seq"]
    assert (await admin.get("/v1/ops/dead-letters?limit=0")).status == 422


async def test_ops_event_stream_delivers_new_messages_of_the_chosen_subjects(api):
    admin = await api.admin()
    client, tenant_id = await api.tenant_user()
    url = "/v1/ops/events?subjects=allocation.cmd.>,gateway.evt.tenant_created"
    async with api.http.get(url, headers={"Authorization": f"Bearer {admin.token}"}) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
        sse = SseReader(resp)
        created = (await client.post("/v1/allocations", {"name": "ops", "shape": "vm.1gpu"})).body

        async def next_event() -> tuple[dict, dict]:
            event = await sse.next_event(timeout=10)
            data = json.loads(event["data"])
            assert data["subject"].startswith("allocation.cmd.") or data["subject"] == "gateway.evt.tenant_created"
            return event, data
        event, data = await eventually(next_event, timeout=10, interval=0, what="the allocation's request on the stream",
                                       until=lambda ev: ev[1]["envelope"].get("data", {}).get("allocation_id") == created["id"])
        assert event["event"] == "allocation.request" and data["stream"] == "TESSERA_ALLOCATION"
        assert event["id"] == f"TESSERA_ALLOCATION:{data['seq']}"
        assert data["envelope"]["tenant_id"] == tenant_id


async def test_ops_event_stream_refuses_bad_subject_filters(api):
    admin = await api.admin()
    for query in ("subjects=foo..bar", "subjects=a.>.b", "subjects=nosuchservice.>"):
        r = await admin.get(f"/v1/ops/events?{query}")
        assert r.status == 422 and r.body["errors"][0]["field"] == "subjects", query


async def test_stopping_the_gateway_closes_open_streams_promptly(infra, provision):
    settings = ServiceSettings(service="gateway", nats_url=infra.nats_url, nats_nkey_file=infra.nkey_file("gateway"),
                               db_dsn=await provision("gateway"),
                               bus=BusSettings(ack_wait_s=5, max_deliver=3, retry_backoff_s=[0.05]))
    rt = partial(build, config=gateway_config())(settings)
    await rt.start()
    stopped: list[bool] = []
    try:
        await _open_streams_then_stop(rt, stopped)
    finally:
        if not stopped:
            await rt.stop()


async def _open_streams_then_stop(rt, stopped: list[bool]) -> None:
    async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{rt.port}") as http:
        async with http.post("/v1/auth/token", headers={"Authorization": f"ApiKey {ADMIN_KEY}"}) as r:
            token = (await r.json())["access_token"]
        client, _ = await Api(rt, http).tenant_user()
        allocation = (await client.post("/v1/allocations", {"name": "shut", "shape": "vm.1gpu"})).body
        auth = {"Authorization": f"Bearer {token}"}
        async with http.get("/v1/ops/events", headers=auth) as ops, \
                http.get(allocation["links"]["events"], headers={"Authorization": f"Bearer {client.token}"}) as events:
            assert ops.status == 200 and events.status == 200
            await asyncio.wait_for(rt.stop(), timeout=10)   # aiohttp would otherwise wait 60 s for open streams
            stopped.append(True)
            # both streams end with a complete response (a clean end of stream, not a cut connection)
            await asyncio.wait_for(ops.content.read(), timeout=5)
            await asyncio.wait_for(events.content.read(), timeout=5)
