"""The rate limits' pure arithmetic: refilling a bucket, taking from several together (all or none), and the
headers a client reads (draft-ietf-httpapi-ratelimit-headers-10, Retry-After)."""
from __future__ import annotations

from services.gateway.api.limits.schemas import RateLimitsSet
from services.gateway.domain.rate_limits import BucketState, Limit, class_of, decision, refill, take
from services.gateway.settings import GatewaySettings

WRITE = Limit(per_s=2, burst=4)


def test_a_bucket_refills_at_its_rate_up_to_its_burst_and_never_backwards():
    assert refill(0.0, 1.0, WRITE) == 2.0
    assert refill(1.5, 0.25, WRITE) == 2.0
    assert refill(3.0, 60.0, WRITE) == 4.0          # capped at the burst
    assert refill(1.0, -5.0, WRITE) == 1.0          # clocks read out of order add nothing


def test_reads_and_writes_are_limited_apart():
    assert [class_of(m) for m in ("GET", "head", "OPTIONS")] == ["read"] * 3
    assert [class_of(m) for m in ("POST", "PUT", "PATCH", "DELETE")] == ["write"] * 4


def test_a_token_is_taken_from_every_bucket_or_from_none():
    assert take([3.0, 1.0], [WRITE, WRITE]) == (True, [2.0, 0.0])
    # the user's bucket is empty: the tenant's keeps its tokens (a refused request drains nothing)
    assert take([3.0, 0.5], [WRITE, WRITE]) == (False, [3.0, 0.5])
    # an unlimited bucket neither refuses nor is drawn from
    assert take([0.0, 2.0], [Limit(0, 1), WRITE]) == (True, [0.0, 1.0])


def test_a_burst_of_requests_is_served_then_refused_until_the_rate_refills_it():
    tokens, served = float(WRITE.burst), 0
    for _ in range(10):                              # ten requests at once
        ok, (tokens,) = take([tokens], [WRITE])
        served += ok
    assert served == WRITE.burst
    ok, _ = take([refill(tokens, 0.5, WRITE)], [WRITE])
    assert ok                                        # half a second at 2/s: one more token


def test_headers_name_each_bucket_and_a_refusal_says_when_to_retry():
    tenant = BucketState("tenant", Limit(100, 200), 150.4)
    user = BucketState("user", Limit(2, 4), 0.5)
    allowed = decision(True, [tenant, BucketState("user", Limit(2, 4), 3.0)])
    h = allowed.headers()
    assert h["RateLimit-Policy"] == '"tenant";q=200;w=2, "user";q=4;w=2'
    assert h["RateLimit"] == '"tenant";r=150;t=1, "user";r=3;t=1'
    assert "Retry-After" not in h
    refused = decision(False, [tenant, user])
    assert refused.headers()["Retry-After"] == "1"     # (1 - 0.5) / 2 s, rounded up
    assert refused.limiting().name == "user"
    slow = decision(False, [BucketState("tenant", Limit(1, 10), 0.0)])
    assert slow.retry_after_s == 1 and slow.headers()["RateLimit"] == '"tenant";r=0;t=10'


def test_unlimited_buckets_are_left_out_of_the_answer():
    d = decision(True, [BucketState("tenant", Limit(0, 1), 0.0), BucketState("user", WRITE, 2.0)])
    assert [b.name for b in d.buckets] == ["user"]
    assert decision(True, [BucketState("tenant", Limit(0, 1), 0.0)]).headers() == {}


def test_the_default_limits_are_generous_and_overrides_are_optional():
    cfg = GatewaySettings(token_secret="x" * 40)
    assert cfg.rate_tenant_read_per_s >= 100 and cfg.rate_tenant_write_per_s >= 100 and cfg.sse_per_tenant >= 10
    assert RateLimitsSet.model_validate({}).model_dump() == dict.fromkeys(RateLimitsSet.model_fields)


def test_every_api_operation_documents_the_429_and_its_retry_after():
    from services.gateway.entrypoints.openapi import document
    for path, item in document()["paths"].items():
        for method, op in item.items():
            if path.startswith("/v1/"):
                assert op["responses"]["429"]["headers"]["Retry-After"]["required"], (method, path)
            else:
                assert "429" not in op["responses"], (method, path)
