"""HTTP models of a tenant's rate limits: the provider admins' overrides and the limits in force."""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import ClassVar

from pydantic import Field

from ...http.schema_base import Body, Out, integer, omittable

MAX_RATE = 1_000_000
PerSecond = integer(1, MAX_RATE)
Burst = integer(1, MAX_RATE)
Streams = integer(1, 100_000)


class RateLimitsSet(Body):
    """A tenant's overrides of the gateway's rate limits; replaces the previous ones whole. A field left out: the
    gateway's setting applies."""

    server_owned: ClassVar[frozenset[str]] = frozenset({"tenant_id", "effective", "overridden", "set_by", "set_at"})
    read_per_s: PerSecond = omittable(description="Reads the tenant may make a second, all its users together.")
    read_burst: Burst = omittable(description="Reads the tenant may make at once after a pause.")
    write_per_s: PerSecond = omittable(description="Writes (POST, PUT, PATCH, DELETE) the tenant may make a second.")
    write_burst: Burst = omittable(description="Writes the tenant may make at once after a pause.")
    user_read_per_s: PerSecond = omittable(description="Reads each of the tenant's users may make a second.")
    user_read_burst: Burst = omittable(description="Reads each user may make at once after a pause.")
    user_write_per_s: PerSecond = omittable(description="Writes each of the tenant's users may make a second.")
    user_write_burst: Burst = omittable(description="Writes each user may make at once after a pause.")
    sse_connections: Streams = omittable(description="Event streams the tenant may hold open at once.")


class LimitOut(Out):
    """One token bucket: ``per_s`` tokens a second, at most ``burst``; ``per_s`` 0: not limited."""

    per_s: int
    burst: int


class EffectiveLimits(Out):
    """The limits in force: the override where set, else the gateway's setting."""

    read: LimitOut
    write: LimitOut
    user_read: LimitOut
    user_write: LimitOut
    sse_connections: int = Field(description="0: not limited.")


class RateLimitsOut(Out):
    """A tenant's rate limits."""

    tenant_id: uuid.UUID
    effective: EffectiveLimits
    overridden: list[str] = Field(description="The fields a provider admin set for this tenant.")
    set_by: uuid.UUID | None = Field(description="Who set the overrides; null: none are set.")
    set_at: datetime | None
