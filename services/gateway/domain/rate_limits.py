"""Token buckets, as pure arithmetic: the rule the database applies (schema/0018_rate_limits.sql, ``rate_take``),
the answer a request gets, and the headers that tell a client where it stands.

A bucket holds at most ``burst`` tokens and gains ``per_s`` a second; a request takes one. Several buckets are
taken from together (a tenant's and its user's): each must hold a token, or none is taken, so a refused request
never drains a bucket it was not refused by. A limit whose ``per_s`` is 0 is no limit.

Headers follow draft-ietf-httpapi-ratelimit-headers-10: ``RateLimit-Policy`` names each bucket's quota (``q``, the
burst) and window (``w``, the seconds an empty bucket takes to fill), ``RateLimit`` its remaining tokens (``r``)
and the seconds until it is full again (``t``). A refusal adds ``Retry-After``: whole seconds until every bucket
that refused holds a token again.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

RateClass = Literal["read", "write"]
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def class_of(method: str) -> RateClass:
    """Reads (GET, HEAD, OPTIONS) and writes (every other method) are limited apart."""
    return "read" if method.upper() in SAFE_METHODS else "write"


@dataclass(frozen=True)
class Limit:
    """``per_s`` tokens a second, at most ``burst`` held; ``per_s`` 0: no limit."""

    per_s: int
    burst: int

    @property
    def unlimited(self) -> bool:
        return self.per_s <= 0


def refill(tokens: float, elapsed_s: float, limit: Limit) -> float:
    """The tokens after ``elapsed_s`` seconds (a negative elapsed time, clocks read out of order, adds none)."""
    return min(float(limit.burst), tokens + limit.per_s * max(0.0, elapsed_s))


@dataclass(frozen=True)
class BucketState:
    """One bucket after a request: its name in the headers, its limit and the tokens it holds now."""

    name: str
    limit: Limit
    tokens: float

    @property
    def remaining(self) -> int:
        return max(0, math.floor(self.tokens))

    @property
    def full_in_s(self) -> int:
        """Whole seconds until the bucket is full again."""
        return max(0, math.ceil((self.limit.burst - self.tokens) / self.limit.per_s))

    @property
    def token_in_s(self) -> int:
        """Whole seconds until the bucket holds a token (at least 1 when it holds none)."""
        if self.tokens >= 1:
            return 0
        return max(1, math.ceil((1 - self.tokens) / self.limit.per_s))

    @property
    def empty_for_s(self) -> float:
        """Seconds until the bucket holds a token again, exactly (0 when it holds one): no request of anyone can
        take a token from it before then, whatever any replica does (tokens only come from time)."""
        return 0.0 if self.tokens >= 1 else (1 - self.tokens) / self.limit.per_s

    @property
    def window_s(self) -> int:
        return max(1, math.ceil(self.limit.burst / self.limit.per_s))


def take(tokens: list[float], limits: list[Limit]) -> tuple[bool, list[float]]:
    """One token from every bucket (already refilled) when each holds one, else from none: (taken, tokens after).
    An unlimited bucket is left out of the decision and keeps its tokens."""
    ok = all(t >= 1 for t, lim in zip(tokens, limits) if not lim.unlimited)
    return ok, [t - 1 if ok and not lim.unlimited else t for t, lim in zip(tokens, limits)]


@dataclass(frozen=True)
class Decision:
    """What the buckets said about one request."""

    allowed: bool
    buckets: tuple[BucketState, ...]

    @property
    def retry_after_s(self) -> int:
        return max((b.token_in_s for b in self.buckets), default=0)

    def headers(self) -> dict[str, str]:
        if not self.buckets:
            return {}
        out = {"RateLimit-Policy": ", ".join(f'"{b.name}";q={b.limit.burst};w={b.window_s}' for b in self.buckets),
               "RateLimit": ", ".join(f'"{b.name}";r={b.remaining};t={b.full_in_s}' for b in self.buckets)}
        if not self.allowed:
            out["Retry-After"] = str(self.retry_after_s)
        return out

    def limiting(self) -> BucketState | None:
        """The bucket that refused (the one to wait longest for), None when allowed."""
        if self.allowed or not self.buckets:
            return None
        return max(self.buckets, key=lambda b: b.token_in_s)


def decision(taken: bool, buckets: list[BucketState]) -> Decision:
    return Decision(taken, tuple(b for b in buckets if not b.limit.unlimited))
