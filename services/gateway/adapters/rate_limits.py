"""The rate limits' state in PostgreSQL, shared by every gateway replica: the buckets (one statement per request,
``tenant_rate_take`` / ``rate_take`` of schema/0018_rate_limits.sql), the provider's per-tenant overrides and the
leases of open event streams."""
from __future__ import annotations

import uuid

import asyncpg

from ..domain.rate_limits import BucketState, Decision, Limit, RateClass, decision

# the overrides a provider admin may set, in the table's and the API's names
OVERRIDE_FIELDS = ("read_per_s", "read_burst", "write_per_s", "write_burst", "user_read_per_s", "user_read_burst",
                   "user_write_per_s", "user_write_burst", "sse_connections")


def _decision(rows: list[asyncpg.Record]) -> Decision:
    taken = all(r["taken"] for r in rows)
    return decision(taken, [BucketState(r["scope"], Limit(int(r["rate"]), int(r["burst"])),
                                        r["tokens"] if r["tokens"] is not None else 0.0) for r in rows])


async def take_member(conn: asyncpg.Connection, tenant_id: uuid.UUID, user_id: uuid.UUID, cls: RateClass,
                      tenant: Limit, user: Limit) -> Decision:
    """One token from the tenant's bucket and the user's (``cls``), or from neither; the tenant's overrides, where
    set, replace ``tenant`` and ``user``. One round trip; row locks end with the statement."""
    rows = await conn.fetch("SELECT * FROM tenant_rate_take($1, $2, $3, $4)", tenant_id, user_id, cls,
                            [float(tenant.per_s), float(tenant.burst), float(user.per_s), float(user.burst)])
    return _decision(rows)


async def take_address(conn: asyncpg.Connection, address: str, cls: RateClass, limit: Limit) -> Decision:
    """One token from the source address's bucket (unauthenticated requests: the token exchange)."""
    rows = await conn.fetch("SELECT * FROM rate_take($1, $2, $3, $4, $5)", cls, ["address"], [address],
                            [float(limit.per_s)], [float(limit.burst)])
    return _decision(rows)


async def overrides(conn: asyncpg.Connection, tenant_id: uuid.UUID) -> asyncpg.Record | None:
    return await conn.fetchrow("SELECT * FROM tenant_rate_limits WHERE tenant_id=$1", tenant_id)


async def set_overrides(conn: asyncpg.Connection, tenant_id: uuid.UUID, values: dict[str, int | None],
                        set_by: uuid.UUID) -> None:
    """Replace the tenant's overrides whole (a field left out: None, the setting applies)."""
    cols = ", ".join(OVERRIDE_FIELDS)
    args = ", ".join(f"${i}" for i in range(2, len(OVERRIDE_FIELDS) + 2))
    updates = ", ".join(f"{c}=EXCLUDED.{c}" for c in (*OVERRIDE_FIELDS, "set_by", "set_at"))
    await conn.execute(
        f"INSERT INTO tenant_rate_limits (tenant_id, {cols}, set_by, set_at) VALUES ($1, {args}, "
        f"${len(OVERRIDE_FIELDS) + 2}, now()) ON CONFLICT (tenant_id) DO UPDATE SET {updates}",
        tenant_id, *(values.get(f) for f in OVERRIDE_FIELDS), set_by)


async def delete_overrides(conn: asyncpg.Connection, tenant_id: uuid.UUID) -> None:
    await conn.execute("DELETE FROM tenant_rate_limits WHERE tenant_id=$1", tenant_id)


# --- event-stream leases -------------------------------------------------------------------------------

async def acquire_stream(conn: asyncpg.Connection, tenant_id: uuid.UUID, lease_id: uuid.UUID, default_limit: int,
                         ttl_s: float) -> tuple[bool, int, int]:
    """A lease for one more open stream of the tenant: (granted, streams open, limit). Serialised per tenant."""
    row = await conn.fetchrow("SELECT * FROM sse_acquire($1, $2, $3, $4)", tenant_id, lease_id, default_limit, ttl_s)
    return row["granted"], row["open_streams"], row["stream_limit"]


async def renew_stream(conn: asyncpg.Connection, tenant_id: uuid.UUID, lease_id: uuid.UUID, ttl_s: float) -> None:
    """Extend the lease (written again if it expired meanwhile: the stream is still open, so it still counts)."""
    await conn.execute("INSERT INTO sse_leases (lease_id, tenant_id, expires_at) VALUES ($1, $2, clock_timestamp() + "
                       "make_interval(secs => $3)) ON CONFLICT (lease_id) DO UPDATE SET expires_at=EXCLUDED.expires_at",
                       lease_id, tenant_id, ttl_s)


async def release_stream(conn: asyncpg.Connection, lease_id: uuid.UUID) -> None:
    await conn.execute("DELETE FROM sse_leases WHERE lease_id=$1", lease_id)
