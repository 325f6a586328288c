"""FOCUS 1.2 rows: the column set, charge and billing period bounds, costs, late-usage corrections, CSV."""
from __future__ import annotations

import csv
import io
import json
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from services.billing.domain import focus
from services.billing.domain.focus import (
    COLUMNS,
    CONDITIONAL,
    CUSTOM,
    MANDATORY,
    BillingPeriod,
    FocusError,
    focus_row,
    focus_rows,
    gpu_line,
    storage_line,
    write_csv,
)
from services.billing.domain.pricing import GpuHourPrice, PriceList, PriceListVersion, price_for, storage_price_for

UTC = UTC
NOV, DEC = datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC)
PRICES = PriceList("tessera", (PriceListVersion(
    "2026-10", "USD", datetime(2026, 10, 1, tzinfo=UTC),
    (GpuHourPrice(2_000_000), GpuHourPrice(3_100_000, gpu_model="H100")), {"standard": 140},
    spot_discount_bps=3000),))
PERIOD = BillingPeriod(NOV, DEC, "ba-acme", "Acme Corp", invoice_id="inv-2026-11")

SPEC_MANDATORY_1_2 = {
    "BilledCost", "BillingAccountId", "BillingAccountName", "BillingCurrency", "BillingPeriodStart",
    "BillingPeriodEnd", "ChargeCategory", "ChargeClass", "ChargeDescription", "ChargePeriodStart",
    "ChargePeriodEnd", "ContractedCost", "EffectiveCost", "ListCost", "InvoiceIssuer", "PricingQuantity",
    "PricingUnit", "ProviderName", "PublisherName", "ServiceCategory", "ServiceName"}


def gpu(start=NOV, hours=1.0, gpus=1, spot=False, model="H100", **kw):
    return gpu_line(tenant_id=kw.pop("tenant_id", str(uuid.uuid4())), tenant_name="tenant", allocation_id="al-1",
                    allocation_name="train", start=start, end=start + timedelta(hours=hours), gpus=gpus,
                    unit_price=price_for(PRICES, None, model, "eu-1", spot, start), gpu_model=model, shape=None,
                    pool="eu-1", region="eu-1", **kw)


def test_all_21_mandatory_columns_and_the_conditional_ones_are_exported():
    assert MANDATORY == SPEC_MANDATORY_1_2
    assert len(MANDATORY) == 21
    assert set(COLUMNS) >= MANDATORY | CONDITIONAL
    assert CUSTOM == {"x_TenantId", "x_GpuModel", "x_Shape", "x_Pool", "x_StorageClass"}
    assert len(COLUMNS) == len(set(COLUMNS))
    assert list(focus_row(gpu(), PERIOD)) == list(COLUMNS)


def test_usage_row_carries_costs_in_the_billing_currency_and_period_bounds():
    row = focus_row(gpu(hours=2, gpus=4), PERIOD)
    assert row["ChargeCategory"] == "Usage" and row["ChargeClass"] is None
    assert row["BilledCost"] == Decimal("24.80") and str(row["BilledCost"]) == "24.80"
    assert row["ListCost"] == row["ContractedCost"] == row["EffectiveCost"] == row["BilledCost"]
    assert (row["PricingQuantity"], row["PricingUnit"]) == (Decimal("8"), "GPU-Hours")
    assert (row["ConsumedQuantity"], row["ConsumedUnit"]) == (Decimal("8"), "GPU-Hours")
    assert row["ListUnitPrice"] == row["ContractedUnitPrice"] == Decimal("3.1")
    assert row["PricingQuantity"] * row["ListUnitPrice"] == row["ListCost"]      # FOCUS: quantity x price = cost
    assert (row["BillingPeriodStart"], row["BillingPeriodEnd"]) == ("2026-11-01T00:00:00Z", "2026-12-01T00:00:00Z")
    assert (row["ChargePeriodStart"], row["ChargePeriodEnd"]) == ("2026-11-01T00:00:00Z", "2026-11-01T02:00:00Z")
    assert row["BillingCurrency"] == "USD" and row["PricingCategory"] == "Standard"
    assert row["SkuPriceId"] == "gpu-hour:model=H100@2026-10"
    assert row["x_GpuModel"] == "H100" and row["x_Pool"] == "eu-1" and row["x_StorageClass"] is None


def test_spot_usage_is_dynamic_and_billed_below_list():
    row = focus_row(gpu(spot=True), PERIOD)
    assert row["PricingCategory"] == "Dynamic"
    assert (row["ListCost"], row["ContractedCost"]) == (Decimal("3.10"), Decimal("3.10"))
    assert (row["BilledCost"], row["EffectiveCost"]) == (Decimal("2.17"), Decimal("2.17"))


def test_subaccount_and_tenant_columns_name_the_tenant_and_tags_are_json():
    tenant = str(uuid.uuid4())
    row = focus_row(gpu(tenant_id=tenant, tags={"team": "ml", "env": "prod"}), PERIOD)
    assert row["SubAccountId"] == row["x_TenantId"] == tenant
    assert json.loads(row["Tags"]) == {"team": "ml", "env": "prod"}
    assert json.loads(focus_row(gpu(), PERIOD)["Tags"]) == {}


def test_storage_row_counts_decimal_gigabyte_hours():
    line = storage_line(tenant_id="t", tenant_name="T", volume_id="vol-1", volume_name="data", start=NOV,
                        end=NOV + timedelta(days=1), size_bytes=500 * 10**9,
                        class_price=storage_price_for(PRICES, "standard", NOV))
    row = focus_row(line, PERIOD)
    assert (row["PricingQuantity"], row["PricingUnit"]) == (Decimal("12000"), "GB-Hours")
    assert row["BilledCost"] == Decimal("1.68") and row["ServiceCategory"] == "Storage"
    assert row["x_StorageClass"] == "standard" and row["x_GpuModel"] is None and row["ResourceType"] == "Volume"


def test_charge_period_end_is_exclusive_so_a_line_may_end_at_the_billing_period_end():
    row = focus_row(gpu(start=DEC - timedelta(hours=1)), PERIOD)
    assert row["ChargePeriodEnd"] == row["BillingPeriodEnd"]
    assert row["ChargeCategory"] == "Usage"


def test_a_line_starting_at_the_billing_period_end_belongs_to_the_next_period():
    with pytest.raises(FocusError) as e:
        focus_row(gpu(start=DEC), PERIOD)
    assert e.value.field == "end"


def test_a_line_straddling_the_period_start_must_be_split_first():
    with pytest.raises(FocusError) as e:
        focus_row(gpu(start=NOV - timedelta(minutes=30)), PERIOD)
    assert e.value.field == "start"


def test_late_usage_of_a_closed_period_is_an_adjustment_correction_in_the_current_period():
    row = focus_row(gpu(start=NOV - timedelta(hours=1)), PERIOD)       # ends exactly at the period start
    assert (row["ChargeCategory"], row["ChargeClass"]) == ("Adjustment", "Correction")
    assert (row["ChargePeriodStart"], row["ChargePeriodEnd"]) == ("2026-10-31T23:00:00Z", "2026-11-01T00:00:00Z")
    assert row["BillingPeriodStart"] == "2026-11-01T00:00:00Z"          # billed now; the closed period is untouched
    assert row["ConsumedQuantity"] is None and row["ConsumedUnit"] is None   # only Usage rows consume
    assert row["BilledCost"] == Decimal("3.10") and row["PricingQuantity"] == Decimal("1")
    assert "late usage" in row["ChargeDescription"]


def test_short_usage_quantity_is_written_to_nine_places_and_cost_from_the_exact_value():
    row = focus_row(gpu(hours=1 / 3600), PERIOD)                        # one GPU-second
    assert row["PricingQuantity"] == Decimal("0.000277778")
    assert row["BilledCost"] == Decimal("0.00")


def test_costs_use_the_currency_exponent():
    jpy = PriceList("p", (PriceListVersion("j1", "JPY", NOV, (GpuHourPrice(450_500_000),)),))
    line = gpu_line(tenant_id="t", tenant_name="T", allocation_id="a", allocation_name="a", start=NOV,
                    end=NOV + timedelta(hours=1), gpus=1, unit_price=price_for(jpy, None, None, None, False, NOV),
                    gpu_model=None, shape=None, pool=None)
    row = focus_row(line, PERIOD)
    assert str(row["BilledCost"]) == "450" and row["BillingCurrency"] == "JPY"   # 450.5 -> 450, ties to even
    assert row["ListUnitPrice"] == Decimal("450.5")


def test_naive_datetimes_and_empty_periods_are_refused():
    with pytest.raises(FocusError) as e:
        BillingPeriod(DEC, NOV, "ba", "n")
    assert e.value.field == "end"
    with pytest.raises(ValueError):
        focus.focus_datetime(datetime(2026, 11, 1))


def test_csv_has_the_header_once_and_empty_cells_for_nulls():
    rows = focus_rows([gpu(), gpu(start=NOV - timedelta(hours=1))], PERIOD)
    buf = io.StringIO(newline="")
    write_csv(rows, buf)
    parsed = list(csv.DictReader(io.StringIO(buf.getvalue(), newline="")))
    assert len(parsed) == 2 and list(parsed[0]) == list(COLUMNS)
    assert parsed[0]["ChargeClass"] == "" and parsed[1]["ChargeClass"] == "Correction"
    assert parsed[1]["ConsumedQuantity"] == ""
    assert parsed[0]["BilledCost"] == "3.10" and parsed[0]["PricingQuantity"] == "1.000000000"


def test_csv_never_writes_exponent_notation():
    zero = storage_line(tenant_id="t", tenant_name="T", volume_id="v", volume_name="v", start=NOV,
                        end=NOV + timedelta(seconds=1), size_bytes=0,
                        class_price=storage_price_for(PRICES, "standard", NOV))
    buf = io.StringIO()
    write_csv([focus_row(zero, PERIOD)], buf)
    assert "E-" not in buf.getvalue() and ",0.000000000," in buf.getvalue()


def test_csv_refuses_rows_with_unknown_columns():
    row = focus_row(gpu(), PERIOD) | {"NotAColumn": "x"}
    with pytest.raises(ValueError):
        write_csv([row], io.StringIO())


def test_a_whole_decimal_is_written_with_a_fractional_part_and_never_in_exponent_notation():
    """A column of whole prices (4 USD per GPU-hour) or JPY costs would read as integers, which FOCUS's
    decimal columns are not (the focus-validator's *_IsDecimal checks fail on them)."""
    from services.billing.domain.focus import _cell
    assert [_cell(Decimal(v)) for v in ("4", "1234", "0E-9", "0.0002", "2E-7", "12.50")] == [
        "4.0", "1234.0", "0.000000000", "0.0002", "0.0000002", "12.50"]
