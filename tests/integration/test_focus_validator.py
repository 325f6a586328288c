"""The FOCUS export passes the FinOps Foundation's own validator (PyPI ``focus-validator``), run as its CLI.

What the installed validator (1.0.0) can check, and what this test therefore asks of it:
  * It knows FOCUS 0.5, 1.0-preview and 1.0, not 1.2; we validate against the newest it knows, '1.0'.
    The test asserts that '1.0' is the newest it lists, so a newer validator makes this test fail until
    ``VALIDATE_VERSION`` (and ``KNOWN_GAPS``) are revisited.
  * ``KNOWN_GAPS`` are skipped through the validator's documented override file, each for a stated reason:
    its 1.0 rule set still uses pre-1.0 column names (Provider, Publisher, ResourceID, and ChargeType inside
    the SkuPriceId SQL rule) where FOCUS 1.0-1.2 say ProviderName, PublisherName, ResourceId and
    ChargeCategory; and it requires the CommitmentDiscount* columns, which FOCUS makes conditional on the
    provider offering commitment discounts (Tessera offers none). The unit tests check those columns.
  * Its CLI exits 0 even when validation fails, so the verdict is read from its JUnit-XML report.
  * It reads its ISO 4217 list from the relative path ``focus_validator/utils/currency_codes.csv``, so it
    runs with its package's parent directory as the working directory.
A missing validator fails this test (never skips). The last test runs it on what the gateway's
``GET /v1/focus`` serves (a tenant's file and the provider-wide one).
"""
from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from services.billing.domain.focus import COLUMNS, BillingPeriod, focus_rows, gpu_line, storage_line, write_csv
from services.billing.domain.pricing import GpuHourPrice, PriceList, PriceListVersion, price_for, storage_price_for
from tests.integration.test_gateway_invoices import focus_month
from tests.support.focus_validator import KNOWN_GAPS, VALIDATE_VERSION, validate
from tests.support.focus_validator import validator_home as find_validator

UTC = UTC
NOV, DEC = datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def validator_home() -> Path:
    return find_validator()


def realistic_rows() -> list[dict]:
    """November for two tenants: on-demand and spot GPU usage, a volume's GB-hours, and one late GPU line
    from October (a closed period) that surfaces as a correction."""
    prices = PriceList("tessera", (PriceListVersion(
        "2026-10", "USD", datetime(2026, 10, 1, tzinfo=UTC),
        (GpuHourPrice(2_000_000), GpuHourPrice(3_100_000, gpu_model="H100"),
         GpuHourPrice(2_900_000, gpu_model="H100", pool="eu-1"), GpuHourPrice(24_000_000, shape="gpu.8xh100")),
        {"standard": 140, "fast": 500}, spot_discount_bps=3500),))
    acme, globex = str(uuid.uuid4()), str(uuid.uuid4())

    def gpu(tenant, name, start, seconds, gpus, shape, model, pool, spot):
        return gpu_line(tenant_id=tenant, tenant_name=name, allocation_id=str(uuid.uuid4()),
                        allocation_name=f"{name}-job", start=start, end=start + timedelta(seconds=seconds),
                        gpus=gpus, unit_price=price_for(prices, shape, model, pool, spot, start), gpu_model=model,
                        shape=shape, pool=pool, region="eu-west", tags={"team": "ml"})

    lines = [
        gpu(acme, "acme", NOV + timedelta(hours=3), 3 * 3600 + 17, 2, None, "H100", "eu-1", False),
        gpu(acme, "acme", NOV + timedelta(days=2), 45 * 60, 8, "gpu.8xh100", "H100", "eu-1", True),
        gpu(globex, "globex", NOV + timedelta(days=5), 1, 1, None, "A100", "us-1", False),
        gpu(globex, "globex", DEC - timedelta(hours=1), 3600, 4, None, "H100", "us-1", True),
        storage_line(tenant_id=globex, tenant_name="globex", volume_id=str(uuid.uuid4()), volume_name="datasets",
                     start=NOV, end=DEC, size_bytes=750 * 10**9,
                     class_price=storage_price_for(prices, "fast", NOV), region="eu-west"),
        gpu(acme, "acme", NOV - timedelta(hours=2), 5400, 1, None, "H100", None, False),    # late: October
    ]
    return focus_rows(lines, BillingPeriod(NOV, DEC, "ba-tessera-eu", "Tessera EU", invoice_id="inv-2026-11"))


def write(path: Path, rows: list[dict], columns=COLUMNS) -> Path:
    with path.open("w", newline="") as f:
        write_csv(rows, f, columns)
    return path


def test_validator_knows_no_version_newer_than_the_one_we_validate_against(validator_home):
    listed = subprocess.run([sys.executable, "-m", "focus_validator.main", "--supported-versions"],
                            cwd=validator_home, capture_output=True, text=True, timeout=120, check=True)
    versions = listed.stdout.split()
    assert VALIDATE_VERSION in versions
    numbered = sorted(tuple(int(p) for p in v.split(".")) for v in versions if v.replace(".", "").isdigit())
    assert numbered[-1] == (1, 0), f"validator now knows {versions}: validate against the newest"


def test_realistic_export_passes_the_focus_validator(validator_home, tmp_path):
    rows = realistic_rows()
    assert {r["ChargeClass"] for r in rows} == {None, "Correction"}
    verdicts = validate(validator_home, write(tmp_path / "focus.csv", rows), tmp_path)
    not_passed = {name: v for name, v in verdicts.items() if v != "passed"}
    assert not_passed == {name: "skipped" for name in KNOWN_GAPS}
    assert len(verdicts) > 100                     # the whole 1.0 rule set ran, not a handful of checks


def test_export_missing_a_mandatory_column_fails_the_focus_validator(validator_home, tmp_path):
    rows = [{k: v for k, v in row.items() if k != "BilledCost"} for row in realistic_rows()]
    data = write(tmp_path / "broken.csv", rows, [c for c in COLUMNS if c != "BilledCost"])
    verdicts = validate(validator_home, data, tmp_path)
    assert verdicts["BilledCost_Required"] == "failed"


def test_export_with_an_invalid_value_fails_the_focus_validator(validator_home, tmp_path):
    rows = realistic_rows()
    rows[0]["ChargeClass"] = "Refund"                                   # not a FOCUS ChargeClass
    rows[1]["BillingCurrency"] = "XYZ"                                  # not ISO 4217
    verdicts = validate(validator_home, write(tmp_path / "broken.csv", rows), tmp_path)
    assert verdicts["ChargeClass_Enum"] == "failed"
    assert verdicts["BillingCurrency_IsCurrencyCode"] == "failed"


async def test_the_gateways_focus_export_passes_the_focus_validator(api, nc, validator_home, tmp_path):
    m = await focus_month(api, nc)     # usage, spot usage, storage and a correction, for two tenants
    for name, query in (("tenant", f"&tenant_id={m['acme']}"), ("provider", "")):
        r = await m["admin"].get(f"/v1/focus?period={m['period']}{query}")
        assert r.status == 200 and "Correction" in r.body, (r.status, r.body)
        data = tmp_path / f"{name}.csv"
        data.write_text(r.body, newline="")
        verdicts = await asyncio.to_thread(validate, validator_home, data, tmp_path)
        not_passed = {check: v for check, v in verdicts.items() if v != "passed"}
        assert not_passed == {check: "skipped" for check in KNOWN_GAPS}, name
        assert len(verdicts) > 100
