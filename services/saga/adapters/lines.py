"""The tenants' lines in the saga schema (asyncpg; the caller owns the transaction).

Counting is correct across coordinator replicas: a request is admitted or put in line only under its
tenant's row lock (``lock``, blocking), and the count is read by a later statement, so it sees what the
previous holder committed. A saga that ends hands its place to the oldest waiting request without that lock
(``take_next_if_room``: it ends one and starts one, so the tenant's count never grows), taking the waiting
row with ``SKIP LOCKED``; when that misses a request that was not committed yet, the deadline loop's
``short_lines`` finds the tenant with room and someone waiting.

Places: a hand-over also records that the tenant's line moved (``moved``, insert-only: it waits on nothing);
the deadline loop takes those lines (``moved_lines``, ``clear_moves``) and tells their waiting requests their
places under the tenant's lock, from what is committed.
"""
from __future__ import annotations

import json
import uuid

import asyncpg

from shared.db import in_list

from ..domain.lines import IN_FLIGHT, Line
from ..domain.model import Saga

# the states written into the statements, so that every plan reads the partial index sagas_in_flight (only
# the sagas in flight), never every allocate saga there ever was (shared.db.in_list)
_IN_FLIGHT = in_list(IN_FLIGHT)
_COUNT = ("(SELECT count(*) FROM (SELECT 1 FROM sagas WHERE tenant_id=$1 AND kind='allocate' "
          f"AND status IN {_IN_FLIGHT} LIMIT $2) f)")   # capped: only "under the bound or not" matters
# a tenant (``w``) with fewer than ``bound`` sagas in flight
SHORT = ("(SELECT count(*) FROM (SELECT 1 FROM sagas s WHERE s.tenant_id=w.tenant_id AND s.kind='allocate' "
         f"AND s.status IN {_IN_FLIGHT} LIMIT {{bound}}) f) < {{bound}}")


async def lock(conn: asyncpg.Connection, tenant_id: uuid.UUID, *, wait: bool = True) -> bool:
    """Hold the tenant's line until the transaction ends (blocks while another holds it, unless ``wait`` is
    False: then False when another holds it). Creates the tenant's row the first time."""
    sql = "SELECT 1 FROM saga_tenants WHERE tenant_id=$1 FOR UPDATE" + ("" if wait else " SKIP LOCKED")
    if await conn.fetchval(sql, tenant_id):
        return True
    if not wait and await conn.fetchval("SELECT 1 FROM saga_tenants WHERE tenant_id=$1", tenant_id):
        return False
    await conn.execute("INSERT INTO saga_tenants (tenant_id) VALUES ($1) ON CONFLICT DO NOTHING", tenant_id)
    return bool(await conn.fetchval(sql, tenant_id))


async def read(conn: asyncpg.Connection, tenant_id: uuid.UUID, allocation_id: uuid.UUID,
               bound: int) -> tuple[bool, Line, str | None]:
    """(whether the allocation already has an allocate saga or waits in line, the tenant's line, the state of the
    allocation's withdrawal: ``adapters.withdrawals.state``), in one statement; read after ``lock``."""
    row = await conn.fetchrow(
        "SELECT EXISTS (SELECT 1 FROM sagas WHERE allocation_id=$3 AND kind='allocate') "
        "OR EXISTS (SELECT 1 FROM saga_waiting WHERE allocation_id=$3) AS known, "
        f"{_COUNT} AS in_flight, EXISTS (SELECT 1 FROM saga_waiting WHERE tenant_id=$1) AS waiting, "
        "(SELECT state FROM saga_withdrawals WHERE allocation_id=$3) AS withdrawal",
        tenant_id, bound, allocation_id)
    return row["known"], Line(row["in_flight"], row["waiting"]), row["withdrawal"]


async def in_flight(conn: asyncpg.Connection, tenant_id: uuid.UUID, bound: int) -> int:
    """The tenant's allocate sagas in flight (counted up to ``bound``)."""
    return await conn.fetchval(f"SELECT {_COUNT}", tenant_id, bound)


async def enqueue(conn: asyncpg.Connection, saga: Saga) -> None:
    """Put the request at the end of its tenant's line (nothing if it is there already)."""
    await conn.execute(
        "INSERT INTO saga_waiting (allocation_id, tenant_id, input) VALUES ($1, $2, $3::jsonb) "
        "ON CONFLICT (allocation_id) DO NOTHING", saga.allocation_id, saga.tenant_id, json.dumps(saga.input))


def _saga(row: asyncpg.Record | None) -> Saga | None:
    if row is None:
        return None
    return Saga(uuid.uuid4(), "allocate", row["allocation_id"], row["tenant_id"], json.loads(row["input"]))


async def take_next(conn: asyncpg.Connection, tenant_id: uuid.UUID) -> Saga | None:
    """Take the oldest waiting request of the tenant that no one else is taking out of its line (never
    blocks); None when there is none. It becomes a new (not yet created) allocate saga."""
    return _saga(await conn.fetchrow(
        "DELETE FROM saga_waiting WHERE seq = (SELECT seq FROM saga_waiting WHERE tenant_id=$1 ORDER BY seq "
        "LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING allocation_id, tenant_id, input", tenant_id))


async def take_next_if_room(conn: asyncpg.Connection, tenant_id: uuid.UUID, bound: int) -> Saga | None:
    """``take_next`` when the tenant has fewer than ``bound`` sagas in flight (this transaction's own writes
    counted), in one statement: what an ending saga runs."""
    return _saga(await conn.fetchrow(
        "DELETE FROM saga_waiting WHERE seq = (SELECT seq FROM saga_waiting WHERE tenant_id=$1 ORDER BY seq "
        f"LIMIT 1 FOR UPDATE SKIP LOCKED) AND {_COUNT} < $2 RETURNING allocation_id, tenant_id, input",
        tenant_id, bound))


async def short_lines(conn: asyncpg.Connection, bound: int, limit: int = 100) -> list[uuid.UUID]:
    """Tenants with requests waiting and fewer than ``bound`` sagas in flight (a missed hand-over)."""
    rows = await conn.fetch(
        "SELECT w.tenant_id FROM (SELECT DISTINCT tenant_id FROM saga_waiting) w "
        f"WHERE {SHORT.format(bound='$1')} LIMIT $2", bound, limit)
    return [r["tenant_id"] for r in rows]


async def leave(conn: asyncpg.Connection, tenant_id: uuid.UUID, allocation_id: uuid.UUID) -> bool:
    """Take the allocation out of its tenant's line; False when it does not wait there. Waits for a hand-over
    that is taking it (its row lock): then it has left already, as a started saga."""
    return await conn.fetchval("DELETE FROM saga_waiting WHERE allocation_id=$1 AND tenant_id=$2 RETURNING true",
                               allocation_id, tenant_id) or False


async def waiting(conn: asyncpg.Connection, tenant_id: uuid.UUID) -> list[tuple[uuid.UUID, int | None]]:
    """The tenant's waiting requests in line order, each with the place it was last told (None: never)."""
    rows = await conn.fetch("SELECT allocation_id, told_place FROM saga_waiting WHERE tenant_id=$1 ORDER BY seq",
                            tenant_id)
    return [(r["allocation_id"], r["told_place"]) for r in rows]


async def joined_at(conn: asyncpg.Connection, tenant_id: uuid.UUID) -> int:
    """The place of a request that just joined its tenant's line (the last): the tenant's waiting requests."""
    return await conn.fetchval("SELECT count(*) FROM saga_waiting WHERE tenant_id=$1", tenant_id)


async def mark_told(conn: asyncpg.Connection, told: list[tuple[uuid.UUID, int]]) -> None:
    """Record the places the requests were told."""
    await conn.execute("UPDATE saga_waiting w SET told_place = t.place FROM unnest($1::uuid[], $2::int[]) "
                       "AS t(allocation_id, place) WHERE w.allocation_id = t.allocation_id",
                       [a for a, _ in told], [p for _, p in told])


async def moved(conn: asyncpg.Connection, tenant_id: uuid.UUID) -> None:
    """Record that the tenant's line moved without its lock (its waiting requests are to be told their places)."""
    await conn.execute("INSERT INTO saga_line_moves (tenant_id) VALUES ($1)", tenant_id)


async def moved_lines(conn: asyncpg.Connection, limit: int = 100) -> list[uuid.UUID]:
    """Tenants whose line moved since their waiting requests were last told their places."""
    rows = await conn.fetch("SELECT DISTINCT tenant_id FROM saga_line_moves LIMIT $1", limit)
    return [r["tenant_id"] for r in rows]


async def clear_moves(conn: asyncpg.Connection, tenant_id: uuid.UUID) -> None:
    """Forget the tenant's recorded moves (those committed so far; a later one is seen by the next pass)."""
    await conn.execute("DELETE FROM saga_line_moves WHERE tenant_id=$1", tenant_id)
