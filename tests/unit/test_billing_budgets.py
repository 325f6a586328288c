"""Budget rules (services/billing/domain/budgets.py): month-to-date forecast, thresholds crossed once, the
webhook signature and the retry schedule. Pure, exact integers."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

from services.billing.domain.budgets import (
    Budget,
    Threshold,
    after_attempt,
    backoff_s,
    callable_url,
    forecast,
    month_of,
    newly_crossed,
    sign,
    standing,
    verify_signature,
)

APRIL_11 = datetime(2026, 4, 11, tzinfo=UTC)          # 10 of April's 30 days elapsed
SECRET = "whsec_0123456789abcdef"


def test_the_month_is_the_utc_calendar_month():
    assert month_of(datetime(2028, 2, 29, 23, 59, tzinfo=UTC)) == (
        datetime(2028, 2, 1, tzinfo=UTC), datetime(2028, 3, 1, tzinfo=UTC))


def test_forecast_extrapolates_spend_over_the_whole_month_rounding_down():
    assert forecast(1000, APRIL_11) == 3000
    assert forecast(1001, APRIL_11) == 3003
    assert forecast(1, APRIL_11 + timedelta(seconds=1)) == 2       # 2.99999... rounds down, never a float


def test_forecast_counts_at_least_one_hour_elapsed():
    start = datetime(2026, 4, 1, tzinfo=UTC)
    assert forecast(10, start + timedelta(minutes=1)) == 10 * 30 * 24 == forecast(10, start + timedelta(hours=1))


def test_thresholds_cross_at_percent_of_budget_on_their_basis():
    budget = Budget(10_000, "USD", (Threshold(50), Threshold(100), Threshold(80, "forecast")))
    s = standing(4_999, APRIL_11)                                 # forecast 14_997
    assert newly_crossed(budget, s, set()) == [Threshold(80, "forecast")]
    s = standing(5_000, APRIL_11)
    assert newly_crossed(budget, s, set()) == [Threshold(50), Threshold(80, "forecast")]


def test_a_threshold_already_crossed_this_month_is_not_crossed_again():
    budget = Budget(10_000, "USD", (Threshold(50), Threshold(100)))
    assert newly_crossed(budget, standing(20_000, APRIL_11), {Threshold(50)}) == [Threshold(100)]
    assert newly_crossed(budget, standing(20_000, APRIL_11), {Threshold(50), Threshold(100)}) == []


def test_a_signature_verifies_the_exact_body_it_signed():
    body = b'{"type":"budget.threshold_crossed","percent":50}'
    header = sign(SECRET, body, 1_700_000_000)
    assert header.startswith("t=1700000000,v1=") and len(header.split("v1=")[1]) == 64
    assert verify_signature(SECRET, body, header, now=1_700_000_010)


def test_a_tampered_body_a_wrong_secret_or_an_old_timestamp_fails_verification():
    body = b'{"type":"budget.threshold_crossed","percent":50}'
    header = sign(SECRET, body, 1_700_000_000)
    assert not verify_signature(SECRET, body.replace(b"50", b"5"), header, now=1_700_000_000)
    assert not verify_signature(SECRET + "x", body, header, now=1_700_000_000)
    assert not verify_signature(SECRET, body, header, now=1_700_000_000 + 301)
    assert not verify_signature(SECRET, body, "v1=deadbeef", now=1_700_000_000)


def test_retries_back_off_doubling_up_to_an_hour_then_fail_after_the_last_attempt():
    assert [backoff_s(n, 2.0) for n in (1, 2, 3, 4)] == [2.0, 4.0, 8.0, 16.0]
    assert backoff_s(20, 2.0) == 3600.0
    now = APRIL_11
    assert after_attempt(0, False, now=now, max_attempts=3, base_s=2.0).next_attempt_at == now + timedelta(seconds=2)
    assert after_attempt(1, False, now=now, max_attempts=3, base_s=2.0).next_attempt_at == now + timedelta(seconds=4)
    assert after_attempt(2, False, now=now, max_attempts=3, base_s=2.0).status == "failed"
    assert after_attempt(2, True, now=now, max_attempts=3, base_s=2.0).status == "delivered"


def test_only_http_and_https_urls_are_called():
    assert callable_url("https://hooks.example.com/x") and callable_url("http://127.0.0.1:8080/")
    assert not any(callable_url(u) for u in ("file:///etc/passwd", "ftp://x/y", "https://", "", None))
