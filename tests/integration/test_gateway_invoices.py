"""Invoices, the FOCUS export and the ledger verify route through the gateway (billing is played by publishing its
events): invoices projected version by version, read by their tenant's admins (404 for another tenant's, 403 for
tenant users) and provider admins, rendered as escaped HTML; a month's FOCUS file per tenant and provider-wide
with exactly its rows; the ledger verify route refused to tenant admins, a 503 with no billing to answer, and
billing's answer when it runs.

Each test uses a month of its own far in the future, so the provider-wide reads see only its own data."""
from __future__ import annotations

import csv
import io
import random
import uuid
from datetime import UTC, datetime, timedelta

from services.billing.bootstrap import build
from tests.support.gateway import assert_problem, project

UTC = UTC


_MONTHS_USED: set[datetime] = set()


def a_month() -> tuple[datetime, datetime, str]:
    """[start, end) of a month no other test uses, and its name (YYYY-MM): drawn at random, never twice in a
    session (two tests that drew the same month once saw each other's rows in the provider-wide file)."""
    start = datetime(random.randint(2100, 2279), random.randint(1, 12), 1, tzinfo=UTC)
    while start in _MONTHS_USED:
        start = datetime(random.randint(2100, 2279), random.randint(1, 12), 1, tzinfo=UTC)
    _MONTHS_USED.add(start)
    end = (start + timedelta(days=32)).replace(day=1)
    return start, end, start.strftime("%Y-%m")


def line(description: str, amount: int, *, currency: str = "USD", correction: bool = False,
         corrects: str | None = None) -> dict:
    return {"line_key": f"gpu:{uuid.uuid4().hex[:8]}", "description": description, "kind": "gpu",
            "correction": correction, "corrects_period": corrects, "sku_price_id": "gpu-hour:default@v1",
            "price_list_version": "v1", "unit": "GPU-hours", "quantity": "2", "amount_minor": amount,
            "currency": currency, "entries": 2}


def invoice(tenant: str, start: datetime, *, invoice_id: str | None = None, version: int = 1, status: str = "draft",
            lines: list[dict] | None = None) -> dict:
    lines = lines if lines is not None else [line("GPU-hours: H100", 720)]
    totals: dict[str, int] = {}
    for ln in lines:
        totals[ln["currency"]] = totals.get(ln["currency"], 0) + ln["amount_minor"]
    end = (start + timedelta(days=32)).replace(day=1)
    amounts = [{"currency": c, "amount_minor": a} for c, a in sorted(totals.items())]
    final = status == "finalized"
    return {"invoice_id": invoice_id or str(uuid.uuid4()), "number": f"TSR-{start:%Y%m}-{tenant[:8]}",
            "tenant_id": tenant, "period_start": start.isoformat(), "period_end": end.isoformat(),
            "grace_until": (end + timedelta(days=3)).isoformat(), "status": status, "totals": amounts, "lines": lines,
            "entries": sum(ln["entries"] for ln in lines), "ledger_sum": amounts,
            "finalized_at": (end + timedelta(days=3)).isoformat() if final else None,
            "content_hash": "ab" * 32 if final else None, "version": version,
            "updated_at": datetime.now(UTC).isoformat()}


async def publish_invoice(api, nc, doc: dict) -> dict:
    await project(api, nc, "billing.invoice_changed", {"invoice": doc}, tenant_id=doc["tenant_id"])
    return doc


async def test_an_invoice_is_replaced_by_a_newer_version_and_never_by_an_older_one(api, nc):
    admin = await api.admin()
    tenant = await api.new_tenant()
    start, _, _ = a_month()
    doc = await publish_invoice(api, nc, invoice(tenant, start, version=2, lines=[line("two", 200)]))
    await publish_invoice(api, nc, {**doc, "version": 1, "lines": [line("one", 100)],
                                    "totals": [{"currency": "USD", "amount_minor": 100}]})
    shown = (await admin.get(f"/v1/invoices/{doc['invoice_id']}")).body
    assert (shown["version"], shown["totals"], [ln["description"] for ln in shown["lines"]]) == (
        2, [{"currency": "USD", "amount_minor": 200}], ["two"])
    await publish_invoice(api, nc, invoice(tenant, start, invoice_id=doc["invoice_id"], version=3,
                                           status="finalized", lines=[line("three", 300)]))
    shown = (await admin.get(f"/v1/invoices/{doc['invoice_id']}")).body
    assert (shown["version"], shown["status"], shown["totals"][0]["amount_minor"]) == (3, "finalized", 300)
    assert shown["content_hash"] == "ab" * 32 and shown["period"] == start.strftime("%Y-%m")


async def test_tenant_admins_read_their_own_invoices_and_never_another_tenants(api, nc):
    admin = await api.admin()
    owner, tenant = await api.tenant_user("tenant_admin")
    other = await api.new_tenant()
    start, _, period = a_month()
    mine = await publish_invoice(api, nc, invoice(tenant, start))
    older = await publish_invoice(api, nc, invoice(tenant, start - timedelta(days=20), status="finalized"))
    theirs = await publish_invoice(api, nc, invoice(other, start))
    listed = (await owner.get("/v1/invoices")).body
    assert [i["invoice_id"] for i in listed["items"]] == [mine["invoice_id"], older["invoice_id"]]   # newest first
    assert "lines" not in listed["items"][0] and listed["items"][0]["links"]["html"].endswith("/html")
    assert [i["invoice_id"] for i in (await owner.get("/v1/invoices?status=finalized")).body["items"]] == [
        older["invoice_id"]]
    assert [i["invoice_id"] for i in (await owner.get(f"/v1/invoices?period={period}")).body["items"]] == [
        mine["invoice_id"]]
    got = (await owner.get(f"/v1/invoices/{mine['invoice_id']}")).body
    assert got["lines"][0]["amount_minor"] == 720 and got["tenant_id"] == tenant
    assert_problem(await owner.get(f"/v1/invoices/{theirs['invoice_id']}"), 404)
    assert_problem(await owner.get(f"/v1/invoices/{theirs['invoice_id']}/html"), 404)
    assert_problem(await owner.get(f"/v1/invoices?tenant_id={other}"), 404)
    assert_problem(await owner.get(f"/v1/invoices/{uuid.uuid4()}"), 404)
    member, _ = await api.new_user(tenant, "tenant_user")
    for path in ("/v1/invoices", f"/v1/invoices/{mine['invoice_id']}", f"/v1/invoices/{mine['invoice_id']}/html",
                 f"/v1/focus?period={period}"):
        assert_problem(await member.get(path), 403)
    everyone = (await admin.get(f"/v1/invoices?period={period}")).body["items"]
    assert {i["invoice_id"] for i in everyone} == {mine["invoice_id"], theirs["invoice_id"]}
    first = await admin.get(f"/v1/invoices?period={period}&limit=1")
    second = await admin.get(f"/v1/invoices?period={period}&limit=1&cursor={first.body['next_cursor']}")
    assert {first.body["items"][0]["invoice_id"], second.body["items"][0]["invoice_id"]} == {
        mine["invoice_id"], theirs["invoice_id"]} and second.body["next_cursor"] is None
    assert [i["invoice_id"] for i in (await admin.get(f"/v1/invoices?tenant_id={other}")).body["items"]] == [
        theirs["invoice_id"]]
    assert_problem(await owner.get("/v1/invoices?period=2026-13"), 422, "period")


async def test_the_html_invoice_escapes_a_hostile_description_and_shows_the_total(api, nc):
    owner, tenant = await api.tenant_user("tenant_admin")
    start, _, _ = a_month()
    hostile = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    doc = await publish_invoice(api, nc, invoice(tenant, start, lines=[
        line(hostile, 123_400), line("late H100 hours", 50, correction=True, corrects="2026-10"),
        line("yen", 1235, currency="JPY")]))
    r = await owner.get(f"/v1/invoices/{doc['invoice_id']}/html")
    assert r.status == 200 and r.content_type == "text/html"
    assert "default-src 'none'" in r.headers["Content-Security-Policy"]
    page = r.body
    assert "<script" not in page and "<img" not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;" in page
    assert "1,234.00 USD" in page and "1,234.50 USD" in page.split("<tfoot>")[1]      # the line; the total
    assert "1,235 JPY" in page                                                          # JPY has no decimals
    assert "correction of 2026-10" in page and 'class="watermark"' in page and ">DRAFT<" in page
    final = await publish_invoice(api, nc, {**doc, "version": 2, "status": "finalized",
                                             "finalized_at": datetime.now(UTC).isoformat(), "content_hash": "cd" * 32})
    page = (await owner.get(f"/v1/invoices/{final['invoice_id']}/html")).body
    assert "cd" * 32 in page and 'class="watermark"' not in page and "FINALIZED" in page


def usage(tenant: str, start: datetime, seconds: int, *, amount: int, list_amount: int | None = None,
          invoice_id: str | None = None, correction: bool = False, spot: bool = False, **over) -> dict:
    data = {"usage_key": f"meter:{uuid.uuid4()}@{start.isoformat()}", "kind": "gpu", "tenant_id": tenant,
            "allocation_id": str(uuid.uuid4()), "shape": "vm.2gpu", "gpu_model": "H100", "pool": "shared",
            "spot": spot, "period_start": start.isoformat(), "period_end": (start + timedelta(hours=1)).isoformat(),
            "quantity": str(seconds), "amount_minor": amount, "currency": "USD", "rated": True,
            "price_list_version": "v1", "sku_price_id": "gpu-hour:model=H100@v1" + (":spot" if spot else ""),
            "ledger_seq": 1, "list_amount_minor": amount if list_amount is None else list_amount,
            "micros_per_unit_hour": 3_600_000, "invoice_id": invoice_id, "correction": correction}
    return {**data, **over}


async def focus_month(api, nc) -> dict:
    """A month for two tenants: acme's on-demand and spot GPU usage, a late hour of the month before billed as a
    correction, an unrated record, and usage that is not the month's; globex's volume. Returns what was made."""
    admin = await api.admin()
    acme_name = f"acme-{uuid.uuid4().hex[:8]}"
    acme = (await admin.post("/v1/tenants", {"name": acme_name})).body["id"]
    globex = await api.new_tenant()
    start, end, period = a_month()
    inv_acme = await publish_invoice(api, nc, invoice(acme, start))
    inv_globex = await publish_invoice(api, nc, invoice(globex, start))
    volume, now = str(uuid.uuid4()), datetime.now(UTC).isoformat()
    await project(api, nc, "storage.volume_changed", {"volume": {
        "volume_id": volume, "tenant_id": globex, "user_id": None, "name": "datasets", "storage_class": "standard",
        "backend": "btrfs", "size_bytes": 500 * 10**9, "state": "available", "version": 1, "created_at": now,
        "updated_at": now}}, globex)
    records = {
        "on_demand": usage(acme, start + timedelta(hours=3), 7200, amount=720, invoice_id=inv_acme["invoice_id"]),
        "spot": usage(acme, start + timedelta(days=2), 3600, amount=252, list_amount=360, spot=True,
                      invoice_id=inv_acme["invoice_id"]),
        "late": usage(acme, start - timedelta(hours=1), 3600, amount=360, invoice_id=inv_acme["invoice_id"],
                      correction=True),
        "unrated": usage(acme, start + timedelta(hours=5), 3600, amount=0, currency="XXX", rated=False,
                         micros_per_unit_hour=None, sku_price_id=None, invoice_id=inv_acme["invoice_id"]),
        "last_month": usage(acme, start - timedelta(hours=5), 3600, amount=360),
        "late_elsewhere": usage(acme, start - timedelta(hours=2), 3600, amount=360, correction=True,
                                invoice_id=str(uuid.uuid4())),
        "next_month": usage(acme, end, 3600, amount=360),
        "volume": usage(globex, start, 500 * 10**9 * 86_400, amount=168, kind="storage", allocation_id=None,
                        volume_id=volume, shape=None, gpu_model=None, pool=None, storage_class="standard",
                        period_end=(start + timedelta(days=1)).isoformat(), micros_per_unit_hour=140,
                        sku_price_id="gb-hour:class=standard@v1", invoice_id=inv_globex["invoice_id"]),
    }
    for data in records.values():
        await project(api, nc, "billing.usage_rated", data, tenant_id=data["tenant_id"])
    owner, _ = await api.new_user(acme, "tenant_admin")
    return {"admin": admin, "owner": owner, "acme": acme, "acme_name": acme_name, "globex": globex,
            "period": period, "start": start, "records": records, "invoices": (inv_acme, inv_globex)}


def rows_of(r) -> list[dict]:
    assert r.status == 200 and r.content_type == "text/csv", (r.status, r.body)
    return list(csv.DictReader(io.StringIO(r.body, newline="")))


def by_resource(rows: list[dict]) -> dict[str, dict]:
    return {row["ResourceId"]: row for row in rows}


async def test_the_focus_file_of_a_tenant_has_exactly_its_months_rows_and_the_corrections_billed_in_it(api, nc):
    m = await focus_month(api, nc)
    rec, (inv_acme, _) = m["records"], m["invoices"]
    r = await m["owner"].get(f"/v1/focus?period={m['period']}")
    assert r.headers["Content-Disposition"] == f"attachment; filename=focus-{m['acme']}-{m['period']}.csv"
    assert r.headers["Tessera-Unrated-Records"] == "1"
    rows = by_resource(rows_of(r))
    assert set(rows) == {rec[k]["allocation_id"] for k in ("on_demand", "spot", "late")}
    on_demand, spot, late = (rows[rec[k]["allocation_id"]] for k in ("on_demand", "spot", "late"))
    assert (on_demand["ChargeCategory"], on_demand["ChargeClass"], on_demand["PricingQuantity"]) == (
        "Usage", "", "2.000000000")
    assert (on_demand["BilledCost"], on_demand["ListCost"], on_demand["ListUnitPrice"]) == ("7.20", "7.20", "3.6")
    assert (spot["BilledCost"], spot["ListCost"], spot["PricingCategory"]) == ("2.52", "3.60", "Dynamic")
    assert (late["ChargeCategory"], late["ChargeClass"], late["ConsumedQuantity"]) == ("Adjustment", "Correction", "")
    assert late["ChargePeriodStart"] == (m["start"] - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert late["BillingPeriodStart"] == m["start"].strftime("%Y-%m-%dT%H:%M:%SZ")
    for row in rows.values():
        assert (row["InvoiceId"], row["BillingAccountId"], row["SubAccountName"]) == (
            inv_acme["invoice_id"], m["acme"], m["acme_name"])
        assert row["SkuId"] == "gpu-hour:model=H100" and row["BillingCurrency"] == "USD"
    assert_problem(await m["owner"].get(f"/v1/focus?period={m['period']}&tenant_id={m['globex']}"), 404)
    assert_problem(await m["owner"].get("/v1/focus"), 422, "period")
    named = await m["admin"].get(f"/v1/focus?period={m['period']}&tenant_id={m['acme']}")
    assert by_resource(rows_of(named)).keys() == rows.keys()


async def test_the_provider_wide_focus_file_has_every_tenants_rows(api, nc):
    m = await focus_month(api, nc)
    rec, (_, inv_globex) = m["records"], m["invoices"]
    r = await m["admin"].get(f"/v1/focus?period={m['period']}")
    assert r.headers["Content-Disposition"] == f"attachment; filename=focus-provider-{m['period']}.csv"
    assert r.headers["Tessera-Unrated-Records"] == "1"
    rows = by_resource(rows_of(r))
    assert set(rows) == {rec["on_demand"]["allocation_id"], rec["spot"]["allocation_id"],
                         rec["late"]["allocation_id"], rec["volume"]["volume_id"]}
    volume = rows[rec["volume"]["volume_id"]]
    assert (volume["ResourceName"], volume["ResourceType"], volume["ServiceCategory"]) == ("datasets", "Volume",
                                                                                          "Storage")
    assert (volume["PricingQuantity"], volume["PricingUnit"], volume["BilledCost"]) == (
        "12000.000000000", "GB-Hours", "1.68")
    assert (volume["InvoiceId"], volume["BillingAccountId"]) == (inv_globex["invoice_id"], m["globex"])
    assert sorted(row["ChargeClass"] for row in rows.values()) == ["", "", "", "Correction"]


async def test_ledger_verify_is_for_provider_admins_and_a_503_when_billing_does_not_answer(api):
    owner, _ = await api.tenant_user("tenant_admin")
    assert_problem(await owner.get("/v1/ops/ledger/verify"), 403)
    r = assert_problem(await (await api.admin()).get("/v1/ops/ledger/verify"), 503)
    assert "billing" in r["detail"]


async def test_ledger_verify_returns_billings_answer_for_an_intact_ledger(api, run_service):
    await run_service("billing", lambda s: build(s, checkpoint_s=0))
    r = await (await api.admin()).get("/v1/ops/ledger/verify")
    assert r.status == 200, r.body
    assert r.body["ok"] is True and r.body["table"] == "billing.ledger_entries"
    assert r.body["first_bad_seq"] is None and r.body["bad_checkpoint"] is None and r.body["entries"] >= 0
