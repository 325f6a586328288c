"""Budgets, their thresholds and the signature of their webhook calls: pure, integer arithmetic, no I/O.

Rules
    A tenant has at most one monthly budget: an amount in integer minor units of one currency, thresholds
    (percent of the budget, on the ``actual`` spend or the ``forecast``), optionally a webhook (URL + secret).
    Month-to-date spend = the tenant's rated usage amounts in the budget's currency whose period starts in the
    current UTC month. Forecast = spend × the month's length / the time elapsed in it (at least one hour, so a
    month's first minutes do not forecast wildly), rounded down to an integer.
    A threshold is crossed when its basis value × 100 ≥ percent × budget, and only once per month (the store
    keeps one row per tenant, month, percent and basis).
Webhook signature (Stripe's scheme)
    ``Tessera-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<raw body>")>``. A receiver
    recomputes the HMAC over the raw body bytes exactly as received, compares in constant time and refuses a
    timestamp older than its tolerance (replays): ``verify_signature`` does all three.
Retries
    A call is retried after ``backoff × 2^(attempts - 1)`` seconds (capped at one hour) until it is answered
    with a 2xx or ``webhook_attempts`` calls failed.
"""
from __future__ import annotations

import calendar
import hashlib
import hmac
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

BASES = ("actual", "forecast")
MIN_ELAPSED = timedelta(hours=1)
MAX_BACKOFF_S = 3600.0
SIGNATURE_HEADER = "Tessera-Signature"
TOLERANCE_S = 300


@dataclass(frozen=True, order=True)
class Threshold:
    percent: int
    basis: str = "actual"

    def __post_init__(self):
        if self.basis not in BASES:
            raise ValueError(f"basis must be one of {BASES}, got {self.basis!r}")
        if isinstance(self.percent, bool) or not isinstance(self.percent, int) or self.percent < 1:
            raise ValueError(f"percent must be a positive integer, got {self.percent!r}")


@dataclass(frozen=True)
class Budget:
    amount_minor: int
    currency: str
    thresholds: tuple[Threshold, ...]


@dataclass(frozen=True)
class Standing:
    """This month's position against a budget."""
    period_start: datetime
    period_end: datetime
    spend_minor: int
    forecast_minor: int


def month_of(now: datetime) -> tuple[datetime, datetime]:
    """[start, end) of the UTC month ``now`` is in."""
    now = now.astimezone(UTC)
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    days = calendar.monthrange(start.year, start.month)[1]
    return start, start + timedelta(days=days)


def _micros(d: timedelta) -> int:
    return (d.days * 86400 + d.seconds) * 10**6 + d.microseconds


def forecast(spend_minor: int, now: datetime) -> int:
    """spend × month length / max(elapsed, 1 hour), rounded down (exact integers)."""
    start, end = month_of(now)
    elapsed = max(now.astimezone(UTC) - start, MIN_ELAPSED)
    return spend_minor * _micros(end - start) // _micros(elapsed)


def standing(spend_minor: int, now: datetime) -> Standing:
    start, end = month_of(now)
    return Standing(start, end, spend_minor, forecast(spend_minor, now))


def newly_crossed(budget: Budget, s: Standing, already: set[Threshold]) -> list[Threshold]:
    """The thresholds crossed at this standing and not crossed before this month, in order."""
    value = {"actual": s.spend_minor, "forecast": s.forecast_minor}
    return [t for t in sorted(set(budget.thresholds))
            if t not in already and value[t.basis] * 100 >= t.percent * budget.amount_minor]


# --- webhooks ---------------------------------------------------------------------------------------------------
def callable_url(url: str | None) -> bool:
    """Only http and https URLs with a host are ever called."""
    if not url:
        return False
    parts = urlsplit(url)
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def sign(secret: str, body: bytes, t: int) -> str:
    """The ``Tessera-Signature`` header value of ``body`` sent at unix time ``t``."""
    mac = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


def verify_signature(secret: str, body: bytes, header: str, *, now: int, tolerance_s: int = TOLERANCE_S) -> bool:
    """True when ``header`` signs exactly ``body`` with ``secret`` and its timestamp is within ``tolerance_s``
    of ``now`` (unix seconds). Any ``v1`` entry may match (several are sent while a secret is rotated)."""
    try:
        items = [part.split("=", 1) for part in header.split(",")]
        t = int(next(v for k, v in items if k.strip() == "t"))
        candidates = [v.strip() for k, v in items if k.strip() == "v1"]
    except (ValueError, StopIteration):
        return False
    if abs(now - t) > tolerance_s:
        return False
    expected = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return any(hmac.compare_digest(expected, c) for c in candidates)


def backoff_s(attempts: int, base_s: float) -> float:
    """Seconds to wait after the ``attempts``-th failed call: base × 2^(attempts-1), at most one hour."""
    return min(base_s * 2 ** max(attempts - 1, 0), MAX_BACKOFF_S)


@dataclass(frozen=True)
class Attempt:
    """What a delivery becomes after one call."""
    status: str                   # pending | delivered | failed
    attempts: int
    next_attempt_at: datetime | None


def after_attempt(attempts_before: int, ok: bool, *, now: datetime, max_attempts: int, base_s: float) -> Attempt:
    attempts = attempts_before + 1
    if ok:
        return Attempt("delivered", attempts, None)
    if attempts >= max_attempts:
        return Attempt("failed", attempts, None)
    return Attempt("pending", attempts, now + timedelta(seconds=backoff_s(attempts, base_s)))
