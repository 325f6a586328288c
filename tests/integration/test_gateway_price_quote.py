"""The price quoted on a new allocation: the 202 carries the GPU-hour price of the price list in force (a shape's
own price, a GPU model's, the spot discount), equal to billing's own ``hourly_price`` and to the price sent in the
allocation.request command; reads show it; no price (null) without a matching price or a list in force; an
idempotent replay answers the same price, whatever was published since. Price lists are played by publishing
billing.price_list_published (the version in force is the one published last here, effective a second ago)."""
from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

from services.billing.domain.pricing import PriceList, hourly_price
from services.billing.domain.usage import version_from_doc
from tests.support.gateway import ensure_default_shapes, project

PRICE_KEYS = {"currency", "hourly_amount", "micros_per_gpu_hour", "spot_discount_bps", "spot", "price_list_version",
              "sku_id", "gpu_count", "quoted_at"}


async def _in_force(api, nc, gpu_hour: list[dict], spot_discount_bps: int = 0, currency: str = "USD") -> dict:
    at = datetime.now(UTC) - timedelta(seconds=1)
    doc = {"version": f"q{uuid.uuid4().hex[:10]}", "currency": currency, "effective_from": at.isoformat(),
           "spot_discount_bps": spot_discount_bps, "gpu_hour": gpu_hour, "gb_hour": {}}
    await project(api, nc, "billing.price_list_published", {**doc, "published_by": str(uuid.uuid4()),
                                                            "published_at": at.isoformat()})
    return doc


async def _shape(api, nc, gpu_count: int, gpu_model: str | None) -> str:
    await ensure_default_shapes(api, nc)
    name = f"vm.q{uuid.uuid4().hex[:8]}"
    await project(api, nc, "scheduler.shape_changed", {"name": name, "kind": "vm", "gpu_count": gpu_count,
                                                       "gpu_model": gpu_model, "version": 1})
    return name


async def _sent_price(api, allocation_id: str) -> dict | None:
    raw = await api.scalar("SELECT convert_from(body, 'UTF8')::jsonb->'data'->'price' FROM outbox "
                           "WHERE type='allocation.request' AND convert_from(body, 'UTF8')::jsonb->'data'->>"
                           "'allocation_id' = $1", allocation_id)
    return json.loads(raw) if raw is not None else None


def _billings_hourly(doc: dict, shape: str, gpu_model: str, spot: bool, gpus: int) -> str:
    prices = PriceList("tessera", (version_from_doc({**doc, "effective_from": datetime.fromisoformat(
        doc["effective_from"])}),))
    return format(hourly_price(prices, shape, gpu_model, "shared", spot, gpus, datetime.now(UTC)).amount, "f")


async def test_the_202_carries_the_shape_price_and_the_model_price_with_the_spot_discount_as_sent_to_billing(api, nc):
    client, _ = await api.tenant_user()
    own, by_model = await _shape(api, nc, 2, "H100"), await _shape(api, nc, 4, "H100")
    doc = await _in_force(api, nc, [{"micros_per_gpu_hour": 5_000_000, "shape": own},
                                    {"micros_per_gpu_hour": 2_500_000, "gpu_model": "H100"},
                                    {"micros_per_gpu_hour": 1_000_000}], spot_discount_bps=3000)
    r = await client.post("/v1/allocations", {"name": "priced", "shape": own})
    assert r.status == 202, r.body
    price = r.body["price"]
    assert set(price) == PRICE_KEYS
    assert (price["currency"], price["hourly_amount"], price["micros_per_gpu_hour"], price["spot"]) == (
        "USD", "10", 5_000_000, False)
    assert price["sku_id"] == f"gpu-hour:shape={own}" and price["price_list_version"] == doc["version"]
    assert price["hourly_amount"] == _billings_hourly(doc, own, "H100", False, 2)
    assert await _sent_price(api, r.body["id"]) == price

    spot = await client.post("/v1/allocations", {"name": "spot", "shape": by_model, "spot": True})
    assert spot.status == 202, spot.body
    quoted = spot.body["price"]
    assert (quoted["hourly_amount"], quoted["spot"], quoted["spot_discount_bps"], quoted["sku_id"]) == (
        "7", True, 3000, "gpu-hour:model=H100")    # 2.5 x 4 GPUs x 0.7
    assert quoted["hourly_amount"] == _billings_hourly(doc, by_model, "H100", True, 4)
    assert await _sent_price(api, spot.body["id"]) == quoted
    assert (await client.get(f"/v1/allocations/{spot.body['id']}")).body["price"] == quoted
    listed = {a["id"]: a["price"] for a in (await client.get("/v1/allocations")).body["items"]}
    assert listed == {r.body["id"]: price, spot.body["id"]: quoted}


async def test_the_price_is_null_when_nothing_matches_or_no_price_list_is_in_force(api, nc):
    client, _ = await api.tenant_user()
    shape = await _shape(api, nc, 1, "H100")
    await _in_force(api, nc, [{"micros_per_gpu_hour": 9_000_000, "pool": "gold"}])
    r = await client.post("/v1/allocations", {"name": "unmatched", "shape": shape})
    assert r.status == 202 and r.body["price"] is None
    assert await _sent_price(api, r.body["id"]) is None
    assert (await client.get(f"/v1/allocations/{r.body['id']}")).body["price"] is None
    await _in_force(api, nc, [{"micros_per_gpu_hour": 9_000_000, "gpu_model": "A100"},
                              {"micros_per_gpu_hour": 1_000_000}])
    # a shape naming no GPU model, where the list prices models: the placement decides, so no quote
    assert (await client.post("/v1/allocations", {"name": "modelless", "shape": "vm.1gpu"})).body["price"] is None
    assert (await client.post("/v1/allocations", {"name": "default", "shape": shape})).body["price"]["hourly_amount"] == "1"
    # no version in force at all: the session's views hold only what tests published, so clear them
    async with api.rt.pool.acquire() as conn:
        await conn.execute("DELETE FROM price_lists_view")
    none = await client.post("/v1/allocations", {"name": "no-list", "shape": shape})
    assert none.status == 202 and none.body["price"] is None and await _sent_price(api, none.body["id"]) is None


async def test_an_idempotent_replay_answers_the_same_price(api, nc):
    client, _ = await api.tenant_user()
    shape = await _shape(api, nc, 2, "H100")
    await _in_force(api, nc, [{"micros_per_gpu_hour": 1_250_000}], currency="EUR")
    key = {"Idempotency-Key": f"quote-{uuid.uuid4().hex}"}
    first = await client.post("/v1/allocations", {"name": "replayed", "shape": shape}, headers=key)
    assert first.status == 202 and first.body["price"]["hourly_amount"] == "2.5"
    assert first.body["price"]["currency"] == "EUR"
    await _in_force(api, nc, [{"micros_per_gpu_hour": 4_000_000}])
    again = await client.post("/v1/allocations", {"name": "replayed", "shape": shape}, headers=key)
    assert again.status == 202 and again.headers.get("Idempotent-Replayed") == "true"
    assert again.body == first.body
    assert (await client.get(f"/v1/allocations/{first.body['id']}")).body["price"] == first.body["price"]
    fresh = await client.post("/v1/allocations", {"name": "fresh", "shape": shape})
    assert fresh.body["price"]["hourly_amount"] == "8" and fresh.body["price"]["currency"] == "USD"


async def test_an_allocation_requested_elsewhere_shows_the_price_its_event_carries(api, nc):
    client, tenant_id = await api.tenant_user()
    allocation_id, now = str(uuid.uuid4()), datetime.now(UTC).isoformat()
    price = {"price_list_version": "v-elsewhere", "currency": "USD", "micros_per_gpu_hour": 3_000_000,
             "spot_discount_bps": 0, "spot": False, "sku_id": "gpu-hour:default", "gpu_count": 2,
             "hourly_amount": "6", "quoted_at": now.replace("+00:00", "Z")}
    await project(api, nc, "allocation.requested", {
        "allocation_id": allocation_id, "tenant_id": tenant_id, "state": "REQUESTED", "at": now,
        "user_id": str(uuid.uuid4()), "name": "elsewhere", "shape": "vm.2gpu", "gpu_count": 2, "volume_gb": 0,
        "price": price}, tenant_id=tenant_id)
    assert (await client.get(f"/v1/allocations/{allocation_id}")).body["price"] == price
