"""Meters in the billing schema: the asyncpg ``MeterRepository``, the cuts of running meters, and the hourly
usage sums they feed, on the unit of work's connection (the caller owns the transaction).

Locks: a stop loads its meter ``FOR UPDATE`` (it waits for a cut in progress); a cut takes running meters
``FOR UPDATE SKIP LOCKED`` (it never waits: a meter being stopped or cut by another replica is left to it)."""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

import asyncpg

from ..domain.model import Meter, QuotedPrice
from ..domain.ports import MeterRepository

_COLUMNS = ("id", "allocation_id", "tenant_id", "shape", "gpu_count", "started_at", "stopped_at", "user_id",
            "gpu_model", "pool", "spot", "cut_until")
_SELECT = f"SELECT {', '.join(_COLUMNS)}, price FROM meters"


def _meter(row: asyncpg.Record) -> Meter:
    price = row["price"]
    doc = json.loads(price) if isinstance(price, str) else price
    return Meter(**{k: row[k] for k in _COLUMNS}, price=QuotedPrice.from_doc(doc))


class PgMeterRepository(MeterRepository):
    def __init__(self, conn: asyncpg.Connection):
        self.conn = conn

    async def get_for_allocation(self, allocation_id: uuid.UUID) -> Meter | None:
        # before its first meter there is no row to lock: two starts of the allocation serialise on this instead
        await self.conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", f"meters:{allocation_id}")
        row = await self.conn.fetchrow(f"{_SELECT} WHERE allocation_id=$1 "
                                       "ORDER BY stopped_at IS NULL DESC, started_at DESC, id LIMIT 1 FOR UPDATE",
                                       allocation_id)
        return _meter(row) if row else None

    async def add(self, m: Meter) -> None:
        await self.conn.execute(
            "INSERT INTO meters (id, allocation_id, tenant_id, shape, gpu_count, started_at, user_id, gpu_model, pool, "
            "spot, price) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11::jsonb)",
            m.id, m.allocation_id, m.tenant_id, m.shape, m.gpu_count, m.started_at, m.user_id, m.gpu_model, m.pool,
            m.spot, json.dumps(m.price.as_doc()) if m.price else None)

    async def save_stop(self, m: Meter) -> None:
        await self.conn.execute("UPDATE meters SET stopped_at=$2, gpu_seconds=$3 WHERE id=$1",
                                m.id, m.stopped_at, m.gpu_seconds)

    async def metered_from(self, allocation_id: uuid.UUID, at: datetime) -> bool:
        return await self.conn.fetchval("SELECT EXISTS (SELECT 1 FROM meters WHERE allocation_id=$1 AND started_at=$2)",
                                        allocation_id, at)

    async def add_activation(self, m: Meter) -> None:
        await self.conn.execute(
            "INSERT INTO meters (id, allocation_id, tenant_id, shape, gpu_count, started_at, user_id, gpu_model, pool, "
            "spot, price, stopped_at, gpu_seconds) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11::jsonb,$12,$13)",
            m.id, m.allocation_id, m.tenant_id, m.shape, m.gpu_count, m.started_at, m.user_id, m.gpu_model, m.pool,
            m.spot, json.dumps(m.price.as_doc()) if m.price else None, m.stopped_at,
            m.gpu_seconds if m.stopped_at else None)

    async def keep_stop_ahead(self, allocation_id: uuid.UUID, at: datetime) -> None:
        await self.conn.execute("INSERT INTO meter_stops_ahead (allocation_id, at) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                                allocation_id, at)

    async def take_stop_ahead(self, allocation_id: uuid.UUID, at: datetime) -> datetime | None:
        return await self.conn.fetchval(
            "DELETE FROM meter_stops_ahead WHERE (allocation_id, at) = (SELECT allocation_id, at FROM meter_stops_ahead "
            "WHERE allocation_id=$1 AND at >= $2 ORDER BY at LIMIT 1) RETURNING at", allocation_id, at)


async def forget_kept_before(conn: asyncpg.Connection, before: datetime) -> int:
    """Delete the stops kept (``keep_stop_ahead``) before ``before``; returns how many."""
    status = await conn.execute("DELETE FROM meter_stops_ahead WHERE kept_at < $1", before)
    return int(status.split()[-1])


async def running_to_cut(conn: asyncpg.Connection, now: datetime, limit: int) -> list[Meter]:
    """Up to ``limit`` running meters with usage not yet recorded before ``now``, locked until the transaction
    ends; meters another transaction holds (a stop, another replica's cut) are skipped."""
    rows = await conn.fetch(f"{_SELECT} WHERE stopped_at IS NULL AND coalesce(cut_until, started_at) < $1 "
                            "ORDER BY coalesce(cut_until, started_at) LIMIT $2 FOR UPDATE SKIP LOCKED", now, limit)
    return [_meter(r) for r in rows]


async def save_cut(conn: asyncpg.Connection, meter_id: uuid.UUID, until: datetime) -> None:
    """Usage of the (locked) meter is recorded up to ``until`` (never moves back)."""
    await conn.execute("UPDATE meters SET cut_until = greatest(coalesce(cut_until, started_at), $2) WHERE id=$1",
                       meter_id, until)


@dataclass
class HourTotals:
    gpu_seconds: Decimal = Decimal(0)
    byte_seconds: Decimal = Decimal(0)
    amounts: dict[str, int] = field(default_factory=dict)   # rated amounts per currency
    records: int = 0


# each (tenant, hour) of h(tenant_id, hour) summed in a subquery of its own (LATERAL), so the table is only ever
# read through the index, whatever its statistics say: a join of the pairs with the table was planned, while
# the table had no statistics yet (a new or fast-growing one), as a hash join over all of it
HOUR_SUMS = ("SELECT h.tenant_id, h.hour, u.kind, u.rated, u.currency, u.quantity, u.amount, u.n FROM {pairs} "
             "CROSS JOIN LATERAL (SELECT kind, rated, currency, sum(quantity) AS quantity, "
             "sum(amount_minor) AS amount, count(*) AS n FROM usage_records WHERE tenant_id = h.tenant_id "
             "AND period_start >= h.hour AND period_start < h.hour + interval '1 hour' "
             "GROUP BY kind, rated, currency) AS u")
HOUR_TOTALS = HOUR_SUMS.format(pairs="unnest($1::uuid[], $2::timestamptz[]) AS h(tenant_id, hour)")


async def hour_totals(conn: asyncpg.Connection,
                      hours: list[tuple[uuid.UUID, datetime]]) -> dict[tuple[uuid.UUID, datetime], HourTotals]:
    """Each (tenant, hour)'s usage records whose period starts in [hour, hour + 1 h), summed, in one query
    (index usage_records_tenant, see HOUR_SUMS); every pair asked for is in the answer (zeros when it has
    none)."""
    return totals_by_hour(await conn.fetch(HOUR_TOTALS, [t for t, _ in hours], [h for _, h in hours]), hours)


def totals_by_hour(rows: list[asyncpg.Record],
                   hours: list[tuple[uuid.UUID, datetime]]) -> dict[tuple[uuid.UUID, datetime], HourTotals]:
    """Rows of sums (tenant_id, hour, kind, rated, currency, quantity, amount, n) as each pair's totals."""
    out = {key: HourTotals() for key in hours}
    for r in rows:
        totals = out[(r["tenant_id"], r["hour"])]
        if r["kind"] == "gpu":
            totals.gpu_seconds += r["quantity"]
        else:
            totals.byte_seconds += r["quantity"]
        if r["rated"]:
            totals.amounts[r["currency"]] = totals.amounts.get(r["currency"], 0) + int(r["amount"])
        totals.records += r["n"]
    return out
