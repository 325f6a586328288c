"""Billing end to end, every service its own process: a provider publishes prices, a
tenant is quoted before it runs, sees its usage and its draft invoice grow while the allocation runs (meters
cut every second here: E2E_ENV), exports a FOCUS file that the FinOps Foundation's validator accepts, and the
ledger verifies."""
from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from tests.support.focus_validator import KNOWN_GAPS, validate, validator_home
from tests.support.polling import eventually

GPU_MICROS = 4_000_000           # 4.00 USD per GPU-hour (the built-in shapes name no GPU model: the default applies)


async def _publish_prices(admin) -> str:
    """A version of its own, taking effect in two seconds (after every earlier one: effective_from is unique)."""
    version = f"e2e-{uuid.uuid4().hex[:8]}"
    effective = datetime.now(UTC) + timedelta(seconds=2)
    await admin.publish_price_list(version, {
        "currency": "USD", "effective_from": effective.isoformat(), "spot_discount_bps": 5000,
        "gpu_prices": [{"micros_per_gpu_hour": GPU_MICROS}, {"micros_per_gpu_hour": 3_000_000, "shape": "vm.8gpu"}],
        "storage_prices": {"standard": 200}})
    await eventually(admin.price_lists, until=lambda b: any(v["version"] == version and v["in_force"]
                                                           for v in b["items"]),
                     timeout=30, what=f"price list {version} in force")
    return version


def _draft(page: dict) -> dict | None:
    return next((i for i in page["items"] if i["status"] == "draft"), None)


async def test_a_priced_allocation_is_quoted_metered_invoiced_exported_and_ledgered(platform, admin, tenant, tmp_path):
    version = await _publish_prices(admin)
    a = await tenant.user.create_allocation("billed-1", shape="vm.1gpu")
    price = a["price"]
    assert (price["price_list_version"], price["currency"], Decimal(price["hourly_amount"])) == (version, "USD", 4)
    assert price["micros_per_gpu_hour"] == GPU_MICROS and price["sku_id"] == "gpu-hour:default"
    await tenant.user.wait_state(a["id"], "ACTIVE", timeout=60)

    # usage grows while it runs: the meter is cut every second, each cut rated with the quoted price
    first = await eventually(lambda: tenant.user.usage(), until=lambda u: any(Decimal(g["gpu_seconds"]) > 0
                                                                              for g in u["groups"]),
                             timeout=30, interval=0.25, what="usage of the running allocation")
    seconds = sum(Decimal(g["gpu_seconds"]) for g in first["groups"])
    await eventually(lambda: tenant.user.usage(), until=lambda u: sum(Decimal(g["gpu_seconds"])
                                                                      for g in u["groups"]) > seconds,
                     timeout=30, interval=0.25, what="usage to grow")

    # the tenant admin reads the month's draft invoice; it grows too, and its lines sum to its ledger entries
    page = await eventually(lambda: tenant.admin.invoices(), until=_draft, timeout=30, interval=0.25,
                              what="a draft invoice")
    draft = await tenant.admin.invoice(_draft(page)["invoice_id"])
    grown = await eventually(lambda: tenant.admin.invoice(draft["invoice_id"]),
                             until=lambda d: d["version"] > draft["version"], timeout=30, interval=0.25,
                             what="the draft to grow")
    assert grown["tenant_id"] == tenant.id and grown["status"] == "draft"
    assert grown["lines"] and all(line["sku_price_id"].endswith(f"@{version}") for line in grown["lines"]
                                  if line["kind"] == "gpu" and line["currency"] == "USD")
    assert grown["totals"] == grown["ledger_sum"]
    assert sum(line["amount_minor"] for line in grown["lines"] if line["currency"] == "USD") == next(
        (t["amount_minor"] for t in grown["totals"] if t["currency"] == "USD"), 0)
    html, headers = await tenant.admin.text(f"/v1/invoices/{grown['invoice_id']}/html")
    assert headers["Content-Type"].startswith("text/html") and grown["number"] in html and "DRAFT" in html

    await tenant.user.release(a["id"])
    await tenant.user.wait_state(a["id"], "RELEASED", timeout=60)

    # the month's FOCUS file of this tenant passes the validator
    period = grown["period"]
    csv, headers = await tenant.admin.text(f"/v1/focus?period={period}")
    assert f"focus-{tenant.id}-{period}.csv" in headers["Content-Disposition"] and a["id"] in csv
    data = tmp_path / "focus.csv"
    data.write_text(csv, newline="")
    verdicts = await asyncio.to_thread(validate, validator_home(), data, tmp_path)
    assert {c: v for c, v in verdicts.items() if v != "passed"} == {c: "skipped" for c in KNOWN_GAPS}

    # and the ledger behind it all verifies
    verified = await admin.ledger_verify()
    assert verified["ok"] and verified["entries"] > 0 and verified["first_bad_seq"] is None
