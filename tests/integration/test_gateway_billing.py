"""Price lists and usage through the gateway (billing is played by publishing its events): the price-list
422s and 409 from billing's own rules, the published versions and refusals, and usage that a tenant's members
read for their tenant only, provider admins for any."""
from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from tests.support.gateway import assert_problem, outbox_count, project

NOW = datetime.now(UTC)


def _price_list(**over) -> dict:
    body = {"currency": "USD", "effective_from": (datetime.now(UTC) + timedelta(days=1)).isoformat(),
            "gpu_prices": [{"micros_per_gpu_hour": 3_600_000}, {"micros_per_gpu_hour": 7_200_000, "gpu_model": "H100"}],
            "storage_prices": {"standard": 100_000}, "spot_discount_bps": 3000}
    return {**body, **over}


async def test_a_valid_price_list_is_sent_to_billing_and_invalid_ones_are_422s(api):
    admin = await api.admin()
    version = f"v{uuid.uuid4().hex[:8]}"
    r = await admin.call("PUT", f"/v1/price-lists/{version}", json_body=_price_list())
    assert r.status == 202 and r.body == {"version": version, "status": "publishing"}
    assert await outbox_count(api, "billing.publish_price_list", "version", version) == 1
    past = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    assert_problem(await admin.call("PUT", f"/v1/price-lists/{version}x", json_body=_price_list(effective_from=past)),
                   422, "effective_from")
    twice = [{"micros_per_gpu_hour": 1, "pool": "a"}, {"micros_per_gpu_hour": 2, "pool": "a"}]
    assert_problem(await admin.call("PUT", f"/v1/price-lists/{version}x", json_body=_price_list(gpu_prices=twice)),
                   422, "gpu_prices")
    both = [{"micros_per_gpu_hour": 1, "shape": "vm.2gpu", "gpu_model": "H100"}]
    assert_problem(await admin.call("PUT", f"/v1/price-lists/{version}x", json_body=_price_list(gpu_prices=both)),
                   422, "shape")
    assert_problem(await admin.call("PUT", f"/v1/price-lists/{version}x", json_body=_price_list(currency="usd")),
                   422, "currency")
    assert_problem(await admin.call("PUT", f"/v1/price-lists/{version}x",
                                    json_body=_price_list(spot_discount_bps=10_001)), 422, "spot_discount_bps")
    member, _ = await api.tenant_user()
    assert_problem(await member.call("PUT", f"/v1/price-lists/{version}y", json_body=_price_list()), 403)
    assert await outbox_count(api, "billing.publish_price_list", "version", f"{version}x") == 0


async def test_published_versions_are_listed_an_effective_one_is_a_409_and_refusals_are_shown(api, nc):
    admin = await api.admin()
    version = f"v{uuid.uuid4().hex[:8]}"
    effective = datetime.now(UTC) - timedelta(seconds=1)
    await project(api, nc, "billing.price_list_published", {
        "version": version, "currency": "EUR", "effective_from": effective.isoformat(), "spot_discount_bps": 0,
        "gpu_hour": [{"micros_per_gpu_hour": 2_000_000, "pool": "shared"}], "gb_hour": {},
        "published_by": str(uuid.uuid4()), "published_at": effective.isoformat()})
    member, _ = await api.tenant_user()
    listed = {v["version"]: v for v in (await member.get("/v1/price-lists")).body["items"]}
    assert listed[version]["in_force"] and listed[version]["gpu_prices"][0]["pool"] == "shared"
    assert listed[version]["published_by"] is None       # who published is the provider's business
    assert_problem(await admin.call("PUT", f"/v1/price-lists/{version}", json_body=_price_list()), 409)
    await project(api, nc, "billing.price_list_rejected", {
        "version": version, "reason": "version: effective since …", "field": "version",
        "requested_by": str(uuid.uuid4()), "at": datetime.now(UTC).isoformat()})
    shown = (await admin.get("/v1/price-lists")).body["rejections"]
    assert any(r["version"] == version and r["field"] == "version" for r in shown)
    assert (await member.get("/v1/price-lists")).body["rejections"] == []


def _usage(tenant: str, gpu_model: str, amount: int, hour: int) -> dict:
    start = NOW.replace(minute=0, second=0, microsecond=0) - timedelta(hours=hour)
    return {"usage_key": f"meter:{uuid.uuid4()}@{start.isoformat()}", "kind": "gpu", "tenant_id": tenant,
            "shape": "vm.2gpu", "gpu_model": gpu_model, "pool": "shared", "spot": False,
            "period_start": start.isoformat(), "period_end": (start + timedelta(hours=1)).isoformat(),
            "quantity": "7200", "amount_minor": amount, "currency": "USD", "rated": True,
            "price_list_version": "v1", "sku_price_id": "gpu-hour:default@v1", "ledger_seq": 1}


async def test_usage_is_the_tenants_own_and_provider_admins_read_any(api, nc):
    member, tenant = await api.tenant_user()
    other_member, other = await api.tenant_user()
    for data in (_usage(tenant, "H100", 1440, 1), _usage(tenant, "A100", 500, 2), _usage(other, "H100", 99, 1)):
        await project(api, nc, "billing.usage_rated", data, tenant_id=data["tenant_id"])
    mine = (await member.get("/v1/usage?group_by=gpu_model")).body
    assert mine["tenant_id"] == tenant
    assert [(g["key"], g["amount_minor"], g["gpu_seconds"]) for g in mine["groups"]] == [
        ("A100", 500, "7200"), ("H100", 1440, "7200")]
    assert_problem(await member.get(f"/v1/usage?tenant_id={other}"), 404)
    theirs = (await other_member.get("/v1/usage")).body["groups"]
    assert [(g["amount_minor"], g["records"]) for g in theirs] == [(99, 1)]
    admin = await api.admin()
    by_hour = (await admin.get(f"/v1/usage?tenant_id={tenant}&group_by=hour")).body["groups"]
    assert sorted(g["amount_minor"] for g in by_hour) == [500, 1440]
    # from the start of the newer record's hour: it is in, the older one (an hour before) is not, whatever the clock
    start = (NOW.replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)).isoformat().replace("+00:00", "Z")
    recent = (await member.get(f"/v1/usage?from={start}")).body["groups"]
    assert [g["amount_minor"] for g in recent] == [1440]
    assert (await member.get(f"/v1/usage?from={start}&to={start}")).body["groups"] == []   # an empty interval
    assert_problem(await member.get("/v1/usage?group_by=colour"), 422, "group_by")
    by_spot = (await member.get("/v1/usage?group_by=spot")).body["groups"]
    assert [(g["key"], g["records"]) for g in by_spot] == [("on-demand", 2)]
    by_user = (await admin.get(f"/v1/usage?tenant_id={tenant}&group_by=user")).body["groups"]
    assert [(g["key"], g["records"]) for g in by_user] == [(None, 2)]      # these records name no user
