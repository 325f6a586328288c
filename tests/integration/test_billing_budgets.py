"""Budgets against real NATS JetStream and PostgreSQL, with a webhook receiver the test runs on 127.0.0.1:
a threshold crossing calls it once, signed; a failed call is retried; no event carries the secret."""
from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from aiohttp import web

from services.billing.bootstrap import build
from services.billing.domain.budgets import verify_signature
from shared.wire import step_key
from tests.support.bus import send_command
from tests.support.polling import eventually

SECRET = f"whsec_{uuid.uuid4().hex}"


class Receiver:
    """A webhook endpoint answering the scripted statuses in turn (then 200), keeping every call."""

    def __init__(self, statuses: list[int]):
        self.statuses, self.calls = list(statuses), []

    async def handle(self, request: web.Request) -> web.Response:
        self.calls.append((dict(request.headers), await request.read()))
        return web.Response(status=self.statuses.pop(0) if self.statuses else 200)


@pytest.fixture
async def receiver():
    runners = []

    async def _start(*statuses: int) -> tuple[Receiver, str]:
        r = Receiver(list(statuses))
        app = web.Application()
        app.router.add_post("/hook", r.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = site._server.sockets[0].getsockname()[1]
        return r, f"http://127.0.0.1:{port}/hook"

    yield _start
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
async def billing(run_service):
    """Billing whose webhook pass runs every 50 ms and retries after 50 ms; a price list of 36 USD per
    GPU-hour (2 GPUs for a minute: 120 cents)."""
    rt = await run_service("billing", lambda s: build(s, checkpoint_s=0, cut_s=0, webhook_tick_s=0.05,
                                                      webhook_backoff_s=0.05, webhook_timeout_s=5,
                                                      webhook_allow_private=True))
    now = datetime.now(UTC)
    body = {"version": f"b-{uuid.uuid4().hex[:6]}", "currency": "USD", "spot_discount_bps": 0,
            "effective_from": (now - timedelta(days=40)).isoformat(), "gpu_hour": [{"micros_per_gpu_hour": 36_000_000}],
            "gb_hour": {}}
    async with rt.pool.acquire() as conn:
        await conn.execute("DELETE FROM price_list_versions")
        await conn.execute("INSERT INTO price_list_versions (version, currency, effective_from, body, published_by) "
                           "VALUES ($1, 'USD', $2, $3::jsonb, $4)", body["version"], now - timedelta(days=40),
                           json.dumps(body), uuid.uuid4())
    return rt


async def _set_budget(nc, watch, tenant: uuid.UUID, url: str | None, **kw) -> dict:
    changed = await watch("billing.evt.budget_changed")
    cmd = {"tenant_id": tenant, "amount_minor": 100, "currency": "USD", "requested_by": uuid.uuid4(),
           "thresholds": [{"percent": 50, "basis": "actual"}], "webhook_url": url, "webhook_secret": SECRET, **kw}
    await send_command(nc.jetstream(), "billing.set_budget", cmd)
    return (await changed.wait_for(lambda i: i[1]["data"]["tenant_id"] == str(tenant)))[0][1]["data"]


async def _use(rt, nc, watch, tenant: uuid.UUID, minutes: int = 1) -> None:
    """A meter of 2 GPUs that ran ``minutes`` this month, stopped through the bus (its usage is rated)."""
    now = datetime.now(UTC)
    start = max(now - timedelta(minutes=minutes), now.replace(day=1, hour=0, minute=0, second=0, microsecond=0))
    alloc = uuid.uuid4()
    async with rt.pool.acquire() as conn:
        await conn.execute("INSERT INTO meters (id, allocation_id, tenant_id, shape, gpu_count, started_at) "
                           "VALUES ($1, $2, $3, 'vm.2gpu', 2, $4)", uuid.uuid4(), alloc, tenant, start)
    rated = await watch("billing.evt.usage_rated")
    saga = uuid.uuid4()
    await send_command(nc.jetstream(), "billing.stop_meter", {
        "saga_id": saga, "step": "stop_meter", "idempotency_key": step_key(saga, "stop_meter"),
        "allocation_id": alloc, "tenant_id": tenant})
    await rated.wait_for(lambda i: i[1]["data"]["allocation_id"] == str(alloc))


def _of(tenant: uuid.UUID, type_: str, **fields):
    return lambda i: (i[1]["type"] == type_ and i[1]["data"]["tenant_id"] == str(tenant)
                      and all(i[1]["data"].get(k) == v for k, v in fields.items()))


async def test_a_budget_threshold_crossing_calls_the_webhook_receiver_once_with_a_valid_signature(
        billing, nc, watch, receiver):
    hook, url = await receiver()
    tenant = uuid.uuid4()
    events = await watch("billing.evt.>")
    standing = await _set_budget(nc, watch, tenant, url)
    assert (standing["amount_minor"], standing["spend_minor"], standing["crossed"]) == (100, 0, [])
    await _use(billing, nc, watch, tenant)
    [delivered] = await events.wait_for(_of(tenant, "billing.webhook_delivery_changed", status="delivered"))
    assert delivered[1]["data"]["attempts"] == 1 and delivered[1]["data"]["last_status"] == 200
    [(headers, body)] = hook.calls
    assert verify_signature(SECRET, body, headers["Tessera-Signature"], now=int(time.time()))
    assert not verify_signature(SECRET, body.replace(b'"percent":50', b'"percent":5'), headers["Tessera-Signature"],
                                now=int(time.time()))
    sent = json.loads(body)
    assert (headers["Tessera-Event"], headers["Content-Type"]) == ("budget.threshold_crossed", "application/json")
    assert headers["Tessera-Delivery"] == sent["delivery_id"] == delivered[1]["data"]["delivery_id"]
    assert (sent["type"], sent["percent"], sent["basis"], sent["budget_minor"]) == (
        "budget.threshold_crossed", 50, "actual", 100) and sent["spend_minor"] >= 50
    # more usage this month crosses nothing again: no second crossing, delivery or call
    await _use(billing, nc, watch, tenant)
    later = await events.wait_for(lambda i: _of(tenant, "billing.budget_changed")(i)
                                  and i[1]["data"]["spend_minor"] > sent["spend_minor"])
    assert [c["percent"] for c in later[-1][1]["data"]["crossed"]] == [50]
    assert len([i for i in events.items if _of(tenant, "billing.budget_threshold_crossed")(i)]) == 1
    async with billing.pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM webhook_deliveries WHERE tenant_id=$1", tenant) == 1
    assert len(hook.calls) == 1


async def test_a_webhook_answered_500_then_200_is_retried_and_delivered_after_two_attempts(
        billing, nc, watch, receiver):
    hook, url = await receiver(500)
    tenant = uuid.uuid4()
    events = await watch("billing.evt.webhook_delivery_changed")
    await _set_budget(nc, watch, tenant, url)
    await _use(billing, nc, watch, tenant)
    await events.wait_for(_of(tenant, "billing.webhook_delivery_changed", status="delivered"))
    states = [(i[1]["data"]["status"], i[1]["data"]["attempts"], i[1]["data"]["last_status"])
              for i in events.items if _of(tenant, "billing.webhook_delivery_changed")(i)]
    assert states == [("pending", 0, None), ("pending", 1, 500), ("delivered", 2, 200)]
    assert len(hook.calls) == 2 and hook.calls[0][1] == hook.calls[1][1]          # the same body, signed anew
    assert all(verify_signature(SECRET, b, h["Tessera-Signature"], now=int(time.time())) for h, b in hook.calls)


async def test_a_webhook_that_never_succeeds_ends_failed_after_the_attempts(run_service, nc, watch, receiver):
    rt = await run_service("billing", lambda s: build(s, checkpoint_s=0, cut_s=0, webhook_tick_s=0.05,
                                                      webhook_backoff_s=0.01, webhook_attempts=3,
                                                      webhook_allow_private=True))
    hook, url = await receiver(500, 502, 503, 504)
    tenant = uuid.uuid4()
    async with rt.pool.acquire() as conn:
        await conn.execute("INSERT INTO webhook_deliveries (id, tenant_id, event, url, secret, body, status, "
                           "next_attempt_at) VALUES ($1, $2, 'budget.threshold_crossed', $3, $4, '{}', 'pending', now())",
                           uuid.uuid4(), tenant, url, SECRET)
        row = await eventually(lambda: conn.fetchrow("SELECT * FROM webhook_deliveries WHERE tenant_id=$1", tenant),
                               until=lambda r: r["status"] != "pending", timeout=20, what="the delivery to end")
    assert (row["status"], row["attempts"], row["last_status"], len(hook.calls)) == ("failed", 3, 503, 3)


async def test_no_published_event_carries_the_webhook_secret(billing, nc, watch, receiver):
    _, url = await receiver()
    tenant = uuid.uuid4()
    events = await watch("billing.evt.>")
    await _set_budget(nc, watch, tenant, url, thresholds=[{"percent": 50, "basis": "actual"},
                                                          {"percent": 80, "basis": "forecast"}])
    await _use(billing, nc, watch, tenant)
    await events.wait_for(_of(tenant, "billing.webhook_delivery_changed", status="delivered"))
    delete = await watch("billing.evt.budget_changed")
    await send_command(nc.jetstream(), "billing.delete_budget", {"tenant_id": tenant, "requested_by": uuid.uuid4()})
    [gone] = await delete.wait_for(_of(tenant, "billing.budget_changed", amount_minor=None))
    mine = [i for i in events.items if i[1].get("tenant_id") == str(tenant)]
    types = {i[1]["type"] for i in mine}
    assert {"billing.budget_changed", "billing.budget_threshold_crossed", "billing.webhook_delivery_changed",
            "billing.usage_rated"} <= types
    assert not [i for i in events.items + [gone] if SECRET in json.dumps(i)]


async def test_by_default_a_webhook_on_an_internal_address_is_refused_without_being_called(run_service, receiver):
    """A tenant's URL must not reach the provider's own network: loopback here (the receiver listens on
    127.0.0.1), private and link-local ranges alike; only TESSERA_BILLING_WEBHOOK_ALLOW_PRIVATE lifts it."""
    rt = await run_service("billing", lambda s: build(s, checkpoint_s=0, cut_s=0, webhook_tick_s=0.05,
                                                      webhook_backoff_s=0.01, webhook_attempts=2))
    hook, url = await receiver()
    by_name = url.replace("127.0.0.1", "localhost")      # resolved, then refused on the address it resolves to
    tenant = uuid.uuid4()
    async with rt.pool.acquire() as conn:
        for target in (url, by_name):
            await conn.execute("INSERT INTO webhook_deliveries (id, tenant_id, event, url, secret, body, status, "
                               "next_attempt_at) VALUES ($1, $2, 'budget.threshold_crossed', $3, $4, '{}', 'pending', "
                               "now())", uuid.uuid4(), tenant, target, SECRET)
        rows = await eventually(
            lambda: conn.fetch("SELECT * FROM webhook_deliveries WHERE tenant_id=$1 ORDER BY url", tenant),
            until=lambda rs: all(r["status"] != "pending" for r in rs), timeout=20, what="both deliveries to end")
    assert [(r["status"], r["attempts"]) for r in rows] == [("failed", 2), ("failed", 2)]
    assert all("not a public address" in r["last_error"] for r in rows), [r["last_error"] for r in rows]
    assert hook.calls == []
