"""`./taskw bench:billing` — not a test. The ledger, invoices and verification at volume, each against a
baseline measured in the same run on the same embedded, durable PostgreSQL (fsync on).

1. Ledger appends/s: N entries (default 5,000) appended through ``shared.ledger_store.append`` (the billing
   ledger's path: the per-table advisory lock, the head read, the row hash, the insert and its read-back
   check), one transaction each, from C concurrent connections (default 8); against plain single-row
   INSERTs of the same columns into a table without chain, lock or triggers, one transaction each, at the
   same concurrency. ``append_ratio`` = appends/s ÷ inserts/s. Appends to one chain are serialised (each
   holds the lock until its commit is on disk), so concurrent INSERTs gain from group commit and appends do
   not; the same pair is also measured on one connection (``serial_append_ratio``).
2. Invoices: R usage records (default 100,000) of T tenants (default 1,000) over one calendar month, rated,
   appended to the ledger and billed on their invoice exactly as billing does it
   (``handlers.rating.rate_and_record``, which also writes the usage record and the ``billing.usage_rated``
   outbox row; the records are of next month, so their invoices are drafts) in transactions of B records
   (default 100) from C connections; then every invoice of the
   month finalized and published (``handlers.invoices.tick`` past the grace period). Figures: records/s
   (and its ratio to the plain INSERTs/s above), the finalization time for the T invoices, and the
   invariant checked afterwards (every invoice's lines sum to its ledger entries).
   Rating takes the ledger's lock once per transaction (one append per batch), so the batches' transactions
   queue on it and this figure is the work done under it, per record.
3. Verify: M chained entries (default 1,000,000) written straight into a copy of the ledger table (hashes
   computed here with shared.chain, rows loaded with COPY) and verified with ``shared.ledger_store.verify``;
   against a plain streamed read of the same rows (a server-side cursor, ``ledger_walk.CHUNK`` rows a round
   trip, as verify fetched them until it read COPY text), so ``verify_ratio`` = verify time ÷ read time is the
   cost of re-hashing and checking. ``verify_ratio_to_copy_read`` compares with the read verify now makes for
   a chain of the covered column types (``COPY (SELECT …) TO STDOUT``, text, counted and dropped), and
   ``verify_ratio_to_row_read`` with the slower read earlier runs used (the cursor iterated row by row, 1,000
   prefetched). Verify hashes in worker processes, one per CPU, so on a busy machine it shares the cores with
   whatever else runs. The verify must find the chain intact.

The last line is one JSON object with every figure, ``target`` (the goal of each headline figure), ``met``
(each one's outcome) and ``meets_target`` (all of them). ``--quick`` shrinks every size (a smoke run).
"""
from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import random
import sys
import time
import uuid
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace

import asyncpg

from services.billing.domain.pricing import PriceList
from services.billing.domain.usage import UsageRecord, version_from_doc
from shared import ledger_store
from shared.chain import GENESIS, canonical_json, row_hash
from shared.contract import load_catalog
from shared.db import create_pool, migrate
from shared.ledger_walk import CHUNK
from shared.outbox import Outbox
from tests.bench.common import provisioned_dsn, work_dir
from tooling.embedded import EmbeddedPostgres

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "services" / "billing" / "schema"
TARGET = {"rate_ledger_invoice_per_s": 2500, "verify_ratio": 2.0}   # at least / at most
UTC = dt.UTC


def say(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


async def _spread(total: int, concurrency: int, one) -> float:
    """Run ``one(i)`` for i in 0..total-1 from ``concurrency`` workers; returns the wall seconds."""
    counter = iter(range(total))

    async def worker():
        for i in counter:
            await one(i)
    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - t0


# --- 1. appends against plain inserts ----------------------------------------------------------------------------
async def appends(pool: asyncpg.Pool, n: int, concurrency: int) -> dict:
    async with pool.acquire() as conn:
        await conn.execute("CREATE TABLE plain_entries (seq bigserial PRIMARY KEY, tenant_id uuid NOT NULL, "
                           "kind text NOT NULL, source_event text NOT NULL UNIQUE, amount_minor bigint NOT NULL, "
                           "currency char(3) NOT NULL, entry jsonb NOT NULL, created_at timestamptz NOT NULL)")
    tenants = [uuid.uuid4() for _ in range(16)]
    entry = {"kind": "gpu", "quantity": "3600", "price_list_version": "bench", "sku_price_id": "gpu-hour:default@bench"}

    async def append(i: int) -> None:
        async with pool.acquire() as conn, conn.transaction():
            await ledger_store.append(conn, "ledger_entries", {
                "tenant_id": tenants[i % 16], "kind": "charge", "source_event": f"bench:append:{i}",
                "amount_minor": 100 + i % 7, "currency": "USD", "entry": entry}, unique="source_event")

    async def insert(i: int) -> None:
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute("INSERT INTO plain_entries (tenant_id, kind, source_event, amount_minor, currency, "
                               "entry, created_at) VALUES ($1, 'charge', $2, $3, 'USD', $4::jsonb, now())",
                               tenants[i % 16], f"bench:insert:{i}", 100 + i % 7, canonical_json(entry))

    await _spread(min(200, n), concurrency, lambda i: insert(10 * n + i))   # warm-up: connections, plans
    insert_s = await _spread(n, concurrency, insert)
    append_s = await _spread(n, concurrency, append)
    serial = max(1, n // 5)        # one connection: no group commit for the inserts, no lock wait for the appends
    serial_insert_s = await _spread(serial, 1, lambda i: insert(2 * n + i))
    serial_append_s = await _spread(serial, 1, lambda i: append(2 * n + i))
    return {"appends": n, "concurrency": concurrency, "append_per_s": round(n / append_s, 1),
            "insert_per_s": round(n / insert_s, 1), "append_ratio": round(insert_s / append_s, 3),
            "serial_append_per_s": round(serial / serial_append_s, 1),
            "serial_insert_per_s": round(serial / serial_insert_s, 1),
            "serial_append_ratio": round(serial_insert_s / serial_append_s, 3)}


# --- 2. invoices -------------------------------------------------------------------------------------------------
async def invoices(pool: asyncpg.Pool, records: int, tenants: int, batch: int, concurrency: int,
                   insert_per_s: float) -> dict:
    from services.billing.handlers import invoices as inv
    from services.billing.handlers.rating import rate_and_record
    from shared.unit_of_work import UnitOfWork

    outbox = Outbox("billing", load_catalog())
    now = dt.datetime.now(UTC)
    # next month: its invoices are open (drafts) while the records are rated, whatever today's date
    start = (now.replace(day=1, hour=0, minute=0, second=0, microsecond=0) + dt.timedelta(days=32)).replace(day=1)
    end = (start + dt.timedelta(days=32)).replace(day=1)
    doc = {"version": "bench", "currency": "USD", "effective_from": start - dt.timedelta(days=1),
           "gpu_hour": [{"micros_per_gpu_hour": 2_500_000}, {"micros_per_gpu_hour": 3_600_000, "gpu_model": "H100"}],
           "gb_hour": {"standard": 100_000}, "spot_discount_bps": 3000}
    PriceList("tessera", (version_from_doc(doc),))            # the bench's own list is valid
    async with pool.acquire() as conn:
        await conn.execute("INSERT INTO price_list_versions (version, currency, effective_from, body, published_by) "
                           "VALUES ('bench', 'USD', $1, $2::jsonb, $3)", doc["effective_from"],
                           json.dumps({**doc, "effective_from": doc["effective_from"].isoformat()}), uuid.uuid4())
    ids = [uuid.uuid4() for _ in range(tenants)]
    rnd = random.Random(7)
    hours = int((end - start).total_seconds() // 3600)

    def record(i: int) -> UsageRecord:
        tenant = ids[i % tenants]
        t0 = start + dt.timedelta(hours=rnd.randrange(hours))
        if i % 5 == 4:
            return UsageRecord("storage", f"bench-{i}@{t0.isoformat()}", "storage", tenant, t0,
                               t0 + dt.timedelta(hours=1), Fraction(3600 * 10**9), volume_id=uuid.uuid4(),
                               storage_class="standard")
        return UsageRecord("meter", f"bench-{i}@{t0.isoformat()}", "gpu", tenant, t0, t0 + dt.timedelta(hours=1),
                           Fraction(3600 * (1 + i % 8)), allocation_id=uuid.uuid4(), shape="vm.1gpu",
                           gpu_model="H100" if i % 2 else "A100", pool="shared", spot=i % 3 == 0,
                           gpu_count=1 + i % 8)

    batches = [[record(i) for i in range(b, min(b + batch, records))] for b in range(0, records, batch)]

    async def rate(i: int) -> None:
        async with UnitOfWork.begin(pool, outbox, name="bench.rate") as uow:
            await rate_and_record(uow, batches[i], correlation_id="bench")
    rate_s = await _spread(len(batches), concurrency, rate)
    rt = SimpleNamespace(pool=pool, outbox=outbox)
    grace = 3 * 86400                         # the default TESSERA_BILLING_INVOICE_GRACE_S
    t0 = time.perf_counter()
    await inv.tick(rt, now=end + dt.timedelta(seconds=grace + 1))
    finalize_s = time.perf_counter() - t0
    async with pool.acquire() as conn:
        counts = await conn.fetchrow("SELECT count(*) FILTER (WHERE status = 'finalized') AS finalized, count(*) AS all "
                                     "FROM invoices WHERE period_start = $1", start)
        broken = await conn.fetchval(
            "SELECT count(*) FROM invoices i WHERE (SELECT coalesce(sum(amount_minor), 0) FROM invoice_lines l "
            "WHERE l.invoice_id = i.id) <> (SELECT coalesce(sum(e.amount_minor), 0) FROM invoice_entries x "
            "JOIN ledger_entries e ON e.seq = x.ledger_seq WHERE x.invoice_id = i.id)")
        unbilled = await conn.fetchval("SELECT count(*) FROM ledger_entries e WHERE e.source_event NOT LIKE "
                                       "'bench:%' AND NOT EXISTS (SELECT 1 FROM invoice_entries x WHERE x.ledger_seq = e.seq)")
    per_s = records / rate_s
    return {"usage_records": records, "tenants": tenants, "batch": batch,
            "rate_ledger_invoice_per_s": round(per_s, 1), "rate_ratio_to_insert": round(per_s / insert_per_s, 3),
            "invoices_finalized": counts["finalized"], "invoices": counts["all"],
            "finalize_s": round(finalize_s, 3), "invoices_not_summing_to_ledger": broken,
            "ledger_entries_on_no_invoice": unbilled}


# --- 3. verify ---------------------------------------------------------------------------------------------------
def _counter(total: list[int]):
    async def sink(chunk: bytes) -> None:
        total[0] += len(chunk)
    return sink


async def verify(admin: asyncpg.Connection, n: int) -> dict:
    await admin.execute("CREATE TABLE billing.bench_ledger (LIKE billing.ledger_entries INCLUDING ALL)")
    await admin.execute("CREATE TABLE billing.bench_ledger_checkpoints "
                        "(LIKE billing.ledger_entries_checkpoints INCLUDING ALL)")
    tenants = [uuid.uuid4() for _ in range(64)]
    base = dt.datetime.now(UTC).replace(microsecond=0)
    prev, rows, t0 = GENESIS, [], time.perf_counter()
    columns = ("seq", "tenant_id", "kind", "source_event", "amount_minor", "currency", "entry", "prev_hash",
               "row_hash", "created_at")
    for seq in range(1, n + 1):
        fields = {"seq": seq, "tenant_id": tenants[seq % 64], "kind": "charge", "source_event": f"bench:{seq}",
                  "amount_minor": seq % 1000, "currency": "USD",
                  "entry": {"kind": "gpu", "quantity": str(seq % 7200), "price_list_version": "bench"},
                  "created_at": base + dt.timedelta(microseconds=seq)}
        digest = row_hash(prev, fields)
        rows.append((seq, fields["tenant_id"], "charge", fields["source_event"], fields["amount_minor"], "USD",
                     canonical_json(fields["entry"]), prev, digest, fields["created_at"]))
        prev = digest
        if len(rows) == 50_000 or seq == n:
            await admin.copy_records_to_table("bench_ledger", schema_name="billing", records=rows, columns=columns)
            rows = []
    build_s = time.perf_counter() - t0
    await admin.execute("ANALYZE billing.bench_ledger")
    await admin.execute("SET search_path TO billing")
    t0 = time.perf_counter()
    async with admin.transaction(isolation="repeatable_read", readonly=True):
        stmt = await admin.prepare("SELECT * FROM bench_ledger ORDER BY seq")
        read, cursor = 0, await stmt.cursor()
        while rows := await cursor.fetch(CHUNK):
            for _ in rows:
                read += 1
    read_s = time.perf_counter() - t0
    t0 = time.perf_counter()   # the read earlier runs compared with: row by row, 1,000 prefetched
    async with admin.transaction(isolation="repeatable_read", readonly=True):
        async for _ in stmt.cursor(prefetch=1000):
            pass
    row_read_s = time.perf_counter() - t0
    copied = [0]
    t0 = time.perf_counter()
    await admin.copy_from_query("SELECT * FROM bench_ledger ORDER BY seq", output=_counter(copied))
    copy_read_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    result = await ledger_store.verify(admin, "bench_ledger")
    verify_s = time.perf_counter() - t0
    return {"verify_entries": n, "verify_s": round(verify_s, 2), "verify_entries_per_s": round(n / verify_s),
            "read_s": round(read_s, 2), "verify_ratio": round(verify_s / read_s, 2), "verify_ok": result.ok,
            "row_read_s": round(row_read_s, 2), "verify_ratio_to_row_read": round(verify_s / row_read_s, 2),
            "copy_read_s": round(copy_read_s, 2), "copy_read_mib": round(copied[0] / 2**20, 1),
            "verify_ratio_to_copy_read": round(verify_s / copy_read_s, 2),
            "verified": result.entries, "build_s": round(build_s, 1), "rows_read": read}


async def main(args) -> dict:
    work = work_dir("tessera-bench-billing-")
    say(f"work dir: {work}")
    pg = EmbeddedPostgres(work / "pg", durable=True).start()
    try:
        dsn = await provisioned_dsn(pg, "billing")
        pool = await create_pool(dsn, "billing", min_size=args.concurrency, max_size=args.concurrency + 2)
        async with pool.acquire() as conn:
            await migrate(conn, "billing", SCHEMA_DIR)
        say(f"1/3 ledger appends vs plain INSERTs: {args.appends} each, {args.concurrency} connections")
        out = {"bench": "billing", **await appends(pool, args.appends, args.concurrency)}
        if "invoices" in args.parts:
            say(f"2/3 invoices: {args.records} usage records of {args.tenants} tenants")
            out.update(await invoices(pool, args.records, args.tenants, args.batch, args.concurrency,
                                      out["insert_per_s"]))
        await pool.close()
        if "verify" in args.parts:
            say(f"3/3 verify: {args.verify_entries} entries")
            admin = await asyncpg.connect(pg.admin_dsn)
            try:
                out.update(await verify(admin, args.verify_entries))
            finally:
                await admin.close()
    finally:
        pg.stop()
    met = {}
    if "rate_ledger_invoice_per_s" in out:
        met["rate_ledger_invoice_per_s"] = out["rate_ledger_invoice_per_s"] >= TARGET["rate_ledger_invoice_per_s"]
    if "verify_ratio" in out:
        met["verify_ratio"] = out["verify_ratio"] <= TARGET["verify_ratio"] and out["verify_ok"]
    return {**out, "target": TARGET, "met": met, "meets_target": bool(met) and all(met.values())}


def cli(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--appends", type=int, default=5000, help="ledger appends (and plain INSERTs) measured")
    ap.add_argument("-c", "--concurrency", type=int, default=8, help="concurrent connections")
    ap.add_argument("--records", type=int, default=100_000, help="usage records rated and invoiced")
    ap.add_argument("--tenants", type=int, default=1000, help="tenants the records belong to (one invoice each)")
    ap.add_argument("--batch", type=int, default=100, help="usage records per transaction")
    ap.add_argument("--verify-entries", type=int, default=1_000_000, help="entries in the verified chain")
    ap.add_argument("--parts", type=lambda v: set(v.split(",")), default={"invoices", "verify"},
                    help="comma-separated parts to run besides the appends: invoices,verify (default both)")
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    args = ap.parse_args(argv)
    if args.quick:
        args.appends, args.records, args.tenants, args.verify_entries = 300, 2000, 50, 20_000
    print(json.dumps(asyncio.run(main(args))))


if __name__ == "__main__":
    cli()
