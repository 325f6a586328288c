"""Budgets and spend caps through the gateway (billing is played by publishing its events): the budget commands
sent with their fields, the webhook secret never returned, who may do what (the tenant's users 403, other tenants
404), the view billing's budget, crossing and delivery events make, and the provider's spend cap refusing new
allocations once the month's rated usage reaches it."""
from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

from tests.support.gateway import assert_problem, outbox_count, project

SECRET = "whsec-" + "k" * 20


def _budget(**over) -> dict:
    body = {"amount_minor": 100_000, "currency": "USD",
            "thresholds": [{"percent": 80, "basis": "actual"}, {"percent": 100, "basis": "forecast"}],
            "webhook_url": "https://hooks.example.com/tessera", "webhook_secret": SECRET}
    return {**body, **over}


async def _sent(api, type_: str, tenant_id: str) -> list[dict]:
    async with api.rt.pool.acquire() as conn:
        rows = await conn.fetch("SELECT convert_from(body, 'UTF8')::jsonb->'data' AS data FROM outbox WHERE type=$1 "
                                "AND convert_from(body, 'UTF8')::jsonb->'data'->>'tenant_id' = $2 ORDER BY seq",
                                type_, tenant_id)
    return [json.loads(r["data"]) for r in rows]


def _month_start() -> datetime:
    return datetime.now(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def _changed(tenant_id: str, version: int, amount: int | None = 100_000, **over) -> dict:
    data = {"tenant_id": tenant_id, "amount_minor": amount, "currency": "USD" if amount else None,
            "thresholds": [{"percent": 80, "basis": "actual"}] if amount else [],
            "webhook_url": "https://hooks.example.com/tessera" if amount else None,
            "period_start": _month_start().isoformat(), "spend_minor": 85_000, "forecast_minor": 120_000,
            "crossed": [{"percent": 80, "basis": "actual", "at": datetime.now(UTC).isoformat()}],
            "version": version, "at": datetime.now(UTC).isoformat()}
    return {**data, **over}


async def test_a_budget_is_sent_to_billing_with_its_fields_and_its_secret_is_never_returned(api, nc):
    admin, tenant = await api.tenant_user("tenant_admin")
    r = await admin.call("PUT", f"/v1/tenants/{tenant}/budget", json_body=_budget())
    assert r.status == 202, r.body
    assert r.body["has_webhook_secret"] and r.body["webhook_secret"] is None and r.body["status"] == "applying"
    [sent] = await _sent(api, "billing.set_budget", tenant)
    assert sent["amount_minor"] == 100_000 and sent["currency"] == "USD" and sent["webhook_secret"] == SECRET
    assert sent["thresholds"] == _budget()["thresholds"] and sent["webhook_url"] == "https://hooks.example.com/tessera"
    assert sent["requested_by"]
    await project(api, nc, "billing.budget_changed", _changed(tenant, 1), tenant_id=tenant)
    got = await admin.get(f"/v1/tenants/{tenant}/budget")
    assert got.status == 200 and SECRET not in json.dumps(got.body)
    budget = got.body["budget"]
    assert budget["amount_minor"] == 100_000 and budget["has_webhook_secret"] and budget["spend_minor"] == 85_000
    assert budget["forecast_minor"] == 120_000 and budget["version"] == 1

    generated = await admin.call("PUT", f"/v1/tenants/{tenant}/budget", json_body=_budget(webhook_secret=None))
    assert generated.status == 202 and len(generated.body["webhook_secret"]) >= 32
    assert (await _sent(api, "billing.set_budget", tenant))[-1]["webhook_secret"] == generated.body["webhook_secret"]
    no_hook = await admin.call("PUT", f"/v1/tenants/{tenant}/budget", json_body=_budget(webhook_url=None))
    assert_problem(no_hook, 422, "webhook_secret")
    bad_url = _budget(webhook_url="https://user:pw@hooks.example.com/")
    assert_problem(await admin.call("PUT", f"/v1/tenants/{tenant}/budget", json_body=bad_url), 422, "webhook_url")
    assert len(await _sent(api, "billing.set_budget", tenant)) == 2
    twice = _budget(thresholds=[{"percent": 90}, {"percent": 50, "basis": "forecast"}, {"percent": 90, "basis": "actual"}])
    once = await admin.call("PUT", f"/v1/tenants/{tenant}/budget", json_body=twice)
    assert once.status == 202 and once.body["thresholds"] == [{"percent": 90, "basis": "actual"},
                                                              {"percent": 50, "basis": "forecast"}]
    assert (await _sent(api, "billing.set_budget", tenant))[-1]["thresholds"] == once.body["thresholds"]

    deleted = await admin.delete(f"/v1/tenants/{tenant}/budget")
    assert deleted.status == 202 and deleted.body == {"tenant_id": tenant, "status": "deleting"}
    assert [d["tenant_id"] for d in await _sent(api, "billing.delete_budget", tenant)] == [tenant]


async def test_the_tenants_users_get_403_other_tenants_404_and_provider_admins_any(api):
    admin, tenant = await api.tenant_user("tenant_admin")
    user, _ = await api.new_user(tenant, "tenant_user")
    stranger, _ = await api.tenant_user("tenant_admin")
    path = f"/v1/tenants/{tenant}/budget"
    for method, body in (("GET", None), ("PUT", _budget()), ("DELETE", None)):
        assert_problem(await user.call(method, path, json_body=body), 403)
        assert_problem(await stranger.call(method, path, json_body=body), 404)
    provider = await api.admin()
    assert (await provider.call("PUT", path, json_body=_budget())).status == 202
    assert (await provider.get(path)).status == 200
    assert_problem(await provider.call("PUT", f"/v1/tenants/{uuid.uuid4()}/budget", json_body=_budget()), 404)
    cap = {"amount_minor": 1, "currency": "USD"}
    assert_problem(await admin.call("PUT", f"/v1/tenants/{tenant}/spend-cap", json_body=cap), 403)
    assert_problem(await admin.delete(f"/v1/tenants/{tenant}/spend-cap"), 403)
    assert await outbox_count(api, "billing.set_budget", "tenant_id", tenant) == 1
    assert await outbox_count(api, "billing.delete_budget", "tenant_id", tenant) == 0


async def test_the_view_shows_billings_budget_crossings_and_the_latest_state_of_each_delivery(api, nc):
    admin, tenant = await api.tenant_user("tenant_admin")
    empty = (await admin.get(f"/v1/tenants/{tenant}/budget")).body
    assert empty == {"tenant_id": tenant, "budget": None, "crossed": [], "deliveries": [], "spend_cap": None}
    current = _changed(tenant, 2)
    await project(api, nc, "billing.budget_changed", current, tenant_id=tenant)
    await project(api, nc, "billing.budget_changed", _changed(tenant, 1, amount=5), tenant_id=tenant)   # stale
    now = datetime.now(UTC)
    await project(api, nc, "billing.budget_threshold_crossed", {
        "tenant_id": tenant, "period_start": _month_start().isoformat(),
        "period_end": (_month_start() + timedelta(days=32)).replace(day=1).isoformat(), "percent": 100,
        "basis": "forecast", "budget_minor": 100_000, "spend_minor": 85_000, "forecast_minor": 120_000,
        "currency": "USD", "at": now.isoformat()}, tenant_id=tenant)
    delivery = str(uuid.uuid4())

    def state(status: str, attempts: int, **over) -> dict:
        return {"delivery_id": delivery, "tenant_id": tenant, "event": "budget.threshold_crossed",
                "url": "https://hooks.example.com/tessera", "status": status, "attempts": attempts,
                "at": (now + timedelta(seconds=attempts)).isoformat(), **over}
    retry = (now + timedelta(minutes=1)).isoformat()
    await project(api, nc, "billing.webhook_delivery_changed",
                  state("pending", 1, last_status=503, last_error="503 Service Unavailable", next_attempt_at=retry),
                  tenant_id=tenant)
    await project(api, nc, "billing.webhook_delivery_changed",
                  state("delivered", 2, last_status=200, delivered_at=now.isoformat()), tenant_id=tenant)
    await project(api, nc, "billing.webhook_delivery_changed", state("pending", 1, last_status=503), tenant_id=tenant)
    view = (await admin.get(f"/v1/tenants/{tenant}/budget")).body
    assert view["budget"]["version"] == 2 and view["budget"]["amount_minor"] == 100_000
    assert [(c["percent"], c["basis"]) for c in view["crossed"]] == [(80, "actual"), (100, "forecast")]
    assert view["crossed"][1]["spend_minor"] == 85_000
    [shown] = view["deliveries"]
    assert (shown["delivery_id"], shown["status"], shown["attempts"], shown["last_status"]) == (delivery, "delivered",
                                                                                                2, 200)
    assert shown["delivered_at"] is not None and shown["next_attempt_at"] is None
    await project(api, nc, "billing.budget_changed", _changed(tenant, 3, amount=None, crossed=[]), tenant_id=tenant)
    await project(api, nc, "billing.budget_changed", current, tenant_id=tenant)   # arriving late: stays deleted
    assert (await admin.get(f"/v1/tenants/{tenant}/budget")).body["budget"] is None
    await project(api, nc, "billing.budget_changed", _changed(tenant, 1), tenant_id=tenant)   # set again, counted afresh
    assert (await admin.get(f"/v1/tenants/{tenant}/budget")).body["budget"]["version"] == 1


def _usage(tenant: str, amount: int, currency: str = "USD") -> dict:
    start = _month_start()
    return {"usage_key": f"meter:{uuid.uuid4()}@{start.isoformat()}", "kind": "gpu", "tenant_id": tenant,
            "shape": "vm.2gpu", "spot": False, "period_start": start.isoformat(),
            "period_end": (start + timedelta(hours=1)).isoformat(), "quantity": "7200", "amount_minor": amount,
            "currency": currency, "rated": True, "price_list_version": "v1", "ledger_seq": 1}


async def test_a_spend_cap_refuses_new_allocations_once_reached_and_none_after_it_is_removed(api, nc):
    member, tenant = await api.tenant_user("tenant_admin")
    provider = await api.admin()
    cap = await provider.call("PUT", f"/v1/tenants/{tenant}/spend-cap", json_body={"amount_minor": 1000,
                                                                                  "currency": "USD"})
    assert cap.status == 200 and cap.body["used_minor"] == 0 and not cap.body["exceeded"], cap.body
    assert (await member.post("/v1/allocations", {"name": "under-cap", "shape": "vm.1gpu"})).status == 202
    await project(api, nc, "billing.usage_rated", _usage(tenant, 600), tenant_id=tenant)
    await project(api, nc, "billing.usage_rated", _usage(tenant, 5000, "EUR"), tenant_id=tenant)   # not the cap's
    assert (await member.post("/v1/allocations", {"name": "still-under", "shape": "vm.1gpu"})).status == 202
    await project(api, nc, "billing.usage_rated", _usage(tenant, 400), tenant_id=tenant)
    name = f"over-{uuid.uuid4().hex[:8]}"
    refused = assert_problem(await member.post("/v1/allocations", {"name": name, "shape": "vm.1gpu"}), 403)
    assert refused["type"].endswith("/spend-cap-exceeded")
    assert (refused["limit"], refused["used"], refused["currency"]) == (1000, 1000, "USD")
    assert await outbox_count(api, "allocation.request", "name", name) == 0
    shown = (await member.get(f"/v1/tenants/{tenant}/budget")).body["spend_cap"]
    assert shown["used_minor"] == 1000 and shown["exceeded"] and shown["amount_minor"] == 1000
    running = (await member.get("/v1/allocations")).body["items"]
    assert {a["name"] for a in running} == {"under-cap", "still-under"}
    assert all(a["state"] == "REQUESTED" for a in running)   # nothing was sent to stop them
    assert await outbox_count(api, "allocation.release", "tenant_id", tenant) == 0
    assert (await provider.delete(f"/v1/tenants/{tenant}/spend-cap")).status == 204
    assert (await member.get(f"/v1/tenants/{tenant}/budget")).body["spend_cap"] is None
    allowed = await member.post("/v1/allocations", {"name": name, "shape": "vm.1gpu"})
    assert allowed.status == 202 and await outbox_count(api, "allocation.request", "name", name) == 1
