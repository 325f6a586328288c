"""Invoice rules (services/billing/domain/invoices.py): UTC months, open and closed invoices, where late usage
goes, line keys and units, totals without the no-currency, and a stable content hash. Pure: no I/O."""
from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from fractions import Fraction

import pytest

from services.billing.domain.invoices import (
    DRAFT,
    FINALIZED,
    Period,
    content_hash,
    invoice_number,
    is_open,
    line_for,
    period_of,
    quantity_in_unit,
    target,
    totals,
)

UTC = UTC
GRACE = timedelta(days=3)


def month(y: int, m: int) -> Period:
    return Period(datetime(y, m, 1, tzinfo=UTC))


def test_a_period_is_the_utc_calendar_month_of_an_instant():
    p = period_of(datetime(2026, 3, 31, 23, 59, 59, 999999, tzinfo=UTC))
    assert (p.start, p.end, p.label) == (datetime(2026, 3, 1, tzinfo=UTC), datetime(2026, 4, 1, tzinfo=UTC), "2026-03")
    assert period_of(datetime(2026, 4, 1, tzinfo=UTC)) == month(2026, 4)          # the end belongs to the next one
    # 00:30 on April 1st in UTC+2 is still March in UTC
    assert period_of(datetime(2026, 4, 1, 0, 30, tzinfo=timezone(timedelta(hours=2)))) == month(2026, 3)
    assert month(2024, 2).end == datetime(2024, 3, 1, tzinfo=UTC)                 # leap February


def test_december_is_followed_by_january_of_the_next_year():
    dec = period_of(datetime(2026, 12, 15, tzinfo=UTC))
    assert dec.end == datetime(2027, 1, 1, tzinfo=UTC) and dec.next() == month(2027, 1)
    assert dec.grace_until(GRACE) == datetime(2027, 1, 4, tzinfo=UTC)


def test_a_naive_instant_has_no_period():
    with pytest.raises(ValueError):
        period_of(datetime(2026, 1, 1))


def test_an_invoice_is_open_while_draft_or_while_missing_before_its_grace_ends():
    march, grace_end = month(2026, 3), datetime(2026, 4, 4, tzinfo=UTC)
    assert is_open(march, None, grace_end - timedelta(microseconds=1), GRACE)
    assert not is_open(march, None, grace_end, GRACE)
    assert is_open(march, DRAFT, grace_end + timedelta(days=30), GRACE)     # not finalized yet: still takes usage
    assert not is_open(march, FINALIZED, datetime(2026, 3, 2, tzinfo=UTC), GRACE)


def test_usage_goes_on_its_own_month_while_that_invoice_is_open():
    now = datetime(2026, 4, 2, tzinfo=UTC)                 # within March's grace
    t = target(datetime(2026, 3, 31, 23, tzinfo=UTC), now, GRACE, {})
    assert (t.period, t.correction, t.corrects) == (month(2026, 3), False, None)


def test_late_usage_of_a_finalized_month_is_a_correction_on_the_next_open_invoice():
    now = datetime(2026, 4, 2, tzinfo=UTC)
    t = target(datetime(2026, 3, 10, tzinfo=UTC), now, GRACE, {month(2026, 3).start: FINALIZED})
    assert (t.period, t.correction, t.corrects) == (month(2026, 4), True, month(2026, 3))


def test_late_usage_skips_every_closed_month_up_to_the_month_of_now():
    now = datetime(2026, 7, 20, tzinfo=UTC)
    statuses = {month(2026, 1).start: FINALIZED, month(2026, 3).start: FINALIZED}   # Feb, Apr-Jun never existed
    t = target(datetime(2026, 1, 5, tzinfo=UTC), now, GRACE, statuses)
    assert (t.period, t.corrects) == (month(2026, 7), month(2026, 1))


def test_late_usage_goes_on_an_earlier_draft_still_open_rather_than_the_month_of_now():
    now = datetime(2026, 5, 20, tzinfo=UTC)      # April's grace is over but April is not finalized yet
    t = target(datetime(2026, 2, 5, tzinfo=UTC), now, GRACE, {month(2026, 2).start: FINALIZED,
                                                              month(2026, 4).start: DRAFT})
    assert (t.period, t.corrects) == (month(2026, 4), month(2026, 2))


def test_a_month_whose_grace_ended_without_an_invoice_is_closed_to_its_usage():
    now = datetime(2026, 4, 4, tzinfo=UTC)
    t = target(datetime(2026, 3, 10, tzinfo=UTC), now, GRACE, {})
    assert (t.period, t.corrects) == (month(2026, 4), month(2026, 3))


def test_late_december_usage_corrects_onto_january_of_the_next_year():
    now = datetime(2027, 1, 10, tzinfo=UTC)
    t = target(datetime(2026, 12, 31, 23, tzinfo=UTC), now, GRACE, {month(2026, 12).start: FINALIZED})
    assert (t.period, t.corrects.label) == (month(2027, 1), "2026-12")


def test_when_the_month_of_now_is_finalized_late_usage_goes_on_the_following_month():
    now = datetime(2026, 4, 10, tzinfo=UTC)
    t = target(datetime(2026, 3, 10, tzinfo=UTC), now, GRACE,
               {month(2026, 3).start: FINALIZED, month(2026, 4).start: FINALIZED})
    assert t.period == month(2026, 5)


def test_line_keys_separate_kind_sku_currency_version_and_correction():
    base = dict(kind="gpu", sku_price_id="gpu-hour:model=H100@v1", currency="USD", price_list_version="v1")
    plain = line_for(**base)
    assert plain.line_key == "gpu|gpu-hour:model=H100@v1|USD|v1" and plain.unit == "GPU-hours"
    assert (plain.correction, plain.corrects_period) == (False, None)
    corr = line_for(**base, corrects=month(2026, 3))
    assert corr.line_key == "correction:2026-03|gpu|gpu-hour:model=H100@v1|USD|v1"
    assert (corr.correction, corr.corrects_period) == (True, "2026-03")
    assert corr.description.startswith("Correction for 2026-03: GPU usage")
    keys = {plain.line_key, corr.line_key, line_for(**{**base, "currency": "EUR"}).line_key,
            line_for(**{**base, "price_list_version": "v2"}).line_key,
            line_for(**{**base, "sku_price_id": "gpu-hour:model=H100@v1:spot"}).line_key,
            line_for(**base, corrects=month(2026, 2)).line_key}
    assert len(keys) == 6


def test_unrated_usage_has_its_own_line_in_no_currency():
    line = line_for(kind="storage", sku_price_id=None, currency="XXX", price_list_version=None)
    assert line.line_key == "storage|unrated|XXX|-" and line.unit == "GB-hours" and "unrated" in line.description
    with pytest.raises(ValueError):
        line_for(kind="network", sku_price_id=None, currency="XXX", price_list_version=None)


def test_quantities_are_shown_in_gpu_hours_and_gb_hours_without_floats():
    assert quantity_in_unit("gpu", Decimal("5400")) == "1.5"
    assert quantity_in_unit("gpu", 7200) == "2"
    assert quantity_in_unit("gpu", Decimal("1")) == "0.000277778"               # 1/3600, half to even
    assert quantity_in_unit("gpu", Decimal("0.000001")) == "0"
    assert quantity_in_unit("storage", Decimal(36 * 10**11)) == "1"             # 1 GB for one hour
    assert quantity_in_unit("storage", Fraction(10**9 * 1800)) == "0.5"
    assert quantity_in_unit("gpu", Decimal("123456789012.345678")) == "34293552.503429355"


def test_totals_are_per_currency_and_leave_out_unrated_usage():
    assert totals([("USD", 100), ("XXX", 0), ("EUR", 5), ("USD", 250)]) == [("EUR", 5), ("USD", 350)]
    assert totals([("XXX", 0)]) == []


def test_the_invoice_number_names_the_month_and_the_tenant():
    tenant = uuid.UUID("0123abcd-0000-4000-8000-000000000000")
    assert invoice_number(tenant, month(2026, 12)) == "TSR-202612-0123abcd"


def _line(key: str, amount: int) -> dict:
    return {"line_key": key, "description": key, "kind": "gpu", "correction": False, "corrects_period": None,
            "sku_price_id": "s@v1", "price_list_version": "v1", "unit": "GPU-hours", "quantity": "1.5",
            "amount_minor": amount, "currency": "USD", "entries": 2}


def test_the_content_hash_is_stable_and_covers_every_line_and_total():
    lines, tot = [_line("a", 100), _line("b", 50)], [{"currency": "USD", "amount_minor": 150}]
    h = content_hash(lines, tot)
    assert len(h) == 64 and h == content_hash(list(reversed(lines)), tot)     # line order does not matter
    # pinned: a change to the canonical form would change every finalized invoice's published hash
    assert h == "2c0dd7ee2d6b2635b37cd25e064e76b2efe753006159dc7fce22e22d6a43d0f9"
    assert content_hash([_line("a", 101), _line("b", 50)], tot) != h
    assert content_hash(lines, [{"currency": "USD", "amount_minor": 151}]) != h
    assert content_hash([{**_line("a", 100), "quantity": "1.50"}, _line("b", 50)], tot) != h
