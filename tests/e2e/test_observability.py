"""Health, readiness, metrics on every service; one trace across every hop; dead letters and ops streams via the gateway."""
from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import aiohttp

from tests.support.bus import make_envelope, publish_envelope
from tests.support.polling import eventually


async def test_every_service_serves_health_readiness_and_metrics(platform):
    async with aiohttp.ClientSession() as s:
        for name, proc in platform.procs.items():
            for path, want in (("/healthz", 200), ("/readyz", 200), ("/metrics", 200)):
                async with s.get(f"http://127.0.0.1:{proc.port}{path}") as r:
                    assert r.status == want, (name, path)
                    if path == "/metrics":
                        assert "tessera_" in await r.text() or "python_info" in await r.text()


async def test_one_trace_spans_gateway_saga_and_every_participant(platform, tenant):
    a = await tenant.user.create_allocation("traced", shape="vm.1gpu", volume_gb=5)
    await tenant.user.wait_state(a["id"], "ACTIVE")
    trace_file = Path(platform.workdir) / "traces.jsonl"
    wanted = {"gateway", "allocation", "saga", "scheduler", "network", "storage", "node_agent", "billing"}

    def services_per_trace() -> dict[str, set[str]]:
        lines = trace_file.read_text().splitlines() if trace_file.exists() else []
        spans = [json.loads(line) for line in lines if line.strip()]
        by_trace: dict[str, set[str]] = {}
        for s in spans:
            attrs = s["attributes"]
            if a["id"] in (attrs.get("tessera.correlation_id"), attrs.get("tessera.allocation_id")):
                by_trace.setdefault(s["trace_id"], set())
        for s in spans:
            if s["trace_id"] in by_trace:
                by_trace[s["trace_id"]].add(s["service"])
        return by_trace
    await eventually(services_per_trace, until=lambda by_trace: any(wanted <= services for services in by_trace.values()),
                     timeout=20, what=f"one trace of {a['id']} through {sorted(wanted)}")
    await tenant.user.release(a["id"])
    await tenant.user.wait_state(a["id"], "RELEASED")


async def test_poison_command_is_visible_to_operators_in_dead_letters(platform, admin, platform_nc):
    bad = make_envelope("billing.start_meter", {"saga_id": str(uuid.uuid4()), "unexpected": True})
    await publish_envelope(platform_nc.jetstream(), "billing.cmd.start_meter", bad)

    async def listed() -> list[dict]:
        _, body, _ = await admin.request("GET", "/v1/ops/dead-letters?limit=50")
        return [d for d in body["items"] if str(bad.id) in json.dumps(d)]
    hits = await eventually(listed, timeout=20, what=f"dead letter {bad.id} listed")
    assert "invalid" in json.dumps(hits[0])


async def test_ops_event_stream_shows_platform_events_to_provider_admins(platform, admin, tenant):
    headers = {"Authorization": f"Bearer {await admin.token()}", "Accept": "text/event-stream"}
    types: list[str] = []
    async with admin.session.get(platform.gateway_url + "/v1/ops/events?subjects=allocation.evt.>",
                                 headers=headers, timeout=aiohttp.ClientTimeout(total=None, sock_read=None)) as r:
        assert r.status == 200
        a = await tenant.user.create_allocation("ops-watched", shape="vm.1gpu")

        async def read():
            async for raw in r.content:
                line = raw.decode().strip()
                if line.startswith("data:") and a["id"] in line:
                    types.append(json.loads(line[5:])["type"])
                    if "allocation.activated" in types:
                        return
        await asyncio.wait_for(read(), timeout=60)
    assert "allocation.requested" in types
    await tenant.user.wait_state(a["id"], "ACTIVE")   # the bus can be ahead of the gateway's view
    await tenant.user.release(a["id"])
    await tenant.user.wait_state(a["id"], "RELEASED")
