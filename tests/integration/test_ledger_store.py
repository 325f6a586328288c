"""The hash-chained ledger on real PostgreSQL: appends (also concurrent ones) form one linear chain, the
service role cannot change or remove rows, and what a superuser changes anyway is found by verify, down to
the row (and the checkpoint) it touched. Each test gets its own schema holding the billing migration's
tables (created by the service role, as shared.db.migrate does), so tampering never leaks between tests."""
from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import sys
import time
import uuid
from pathlib import Path

import asyncpg
import pytest

from services.billing.adapters.ledger import PgLedger
from shared.chain import GENESIS, RowEncoder, canonical, merkle_root, row_hash
from shared.db import migrate, role_name
from shared.ledger_store import ChainError, append, append_many, checkpoint, verify

ROOT = Path(__file__).resolve().parents[2]
MIGRATION = ROOT / "services/billing/schema/0002_ledger.sql"


class Ledger:
    def __init__(self, dsn: str, schema: str, conn: asyncpg.Connection, admin: asyncpg.Connection):
        self.dsn, self.schema, self.conn, self.admin = dsn, schema, conn, admin
        self.table = f"{schema}.ledger_entries"

    async def service_conn(self) -> asyncpg.Connection:
        return await asyncpg.connect(self.dsn, server_settings={"search_path": self.schema})

    async def tamper(self, sql: str, *args) -> None:
        """Run ``sql`` as the superuser with triggers off (session_replication_role = replica)."""
        async with self.admin.transaction():
            await self.admin.execute("SET LOCAL session_replication_role = replica")
            await self.admin.execute(f"SET LOCAL search_path = {self.schema}")
            await self.admin.execute(sql, *args)


@pytest.fixture
async def ledger(infra, provision):
    dsn = await provision("billing")
    schema = f"ledger_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(infra.admin_dsn)
    await admin.execute(f"CREATE SCHEMA {schema} AUTHORIZATION {role_name('billing')}")
    conn = await asyncpg.connect(dsn, server_settings={"search_path": schema})
    await conn.execute(MIGRATION.read_text())
    try:
        yield Ledger(dsn, schema, conn, admin)
    finally:
        await conn.close()
        await admin.execute(f"DROP SCHEMA {schema} CASCADE")
        await admin.close()


def charge(amount: int = 1250, **extra) -> dict:
    return {"tenant_id": uuid.uuid4(), "kind": "charge", "source_event": f"usage-{uuid.uuid4()}",
            "amount_minor": amount, "currency": "EUR",
            "entry": {"sku": "gpu.h100.hour", "quantity": "1.5", "unit": "hour", "note": "Zürich", "tiers": [1, 2]},
            **extra}


async def fill(ledger: Ledger, n: int) -> list:
    return [await append(ledger.conn, "ledger_entries", charge(100 * i)) for i in range(1, n + 1)]


async def test_billing_migrations_give_the_service_role_an_append_only_ledger(provision):
    conn = await asyncpg.connect(await provision("billing"))
    try:
        await migrate(conn, "billing", ROOT / "services/billing/schema")
        assert await conn.fetchval("SELECT name FROM schema_migrations WHERE name = 'svc/0002_ledger.sql'")
        for table in ("billing.ledger_entries", "billing.ledger_entries_checkpoints"):
            assert await conn.fetchval("SELECT has_table_privilege($1, 'INSERT')", table)
            for privilege in ("UPDATE", "DELETE", "TRUNCATE"):
                assert not await conn.fetchval("SELECT has_table_privilege($1, $2)", table, privilege)
        ledger = PgLedger(conn)
        async with conn.transaction():   # the unit of work's transaction
            e = charge()
            first = await ledger.record(**e)
            assert await ledger.record(**e) == first   # the same usage event is rated once
        assert (await ledger.checkpoint()).last_seq == first.seq
        assert (await ledger.verify()).ok
    finally:
        await conn.close()


async def test_appends_form_a_chain_of_gap_free_seqs_each_linked_to_the_last(ledger):
    got = await fill(ledger, 5)
    assert [a.seq for a in got] == [1, 2, 3, 4, 5]
    rows = await ledger.conn.fetch("SELECT * FROM ledger_entries ORDER BY seq")
    prev = GENESIS
    for (_seq, digest), r in zip(got, rows):
        assert bytes(r["prev_hash"]) == prev and bytes(r["row_hash"]) == digest
        fields = {**dict(r.items()), "entry": json.loads(r["entry"])}
        assert row_hash(prev, fields) == digest
        prev = digest
    result = await verify(ledger.conn, "ledger_entries")
    assert result.ok and result.entries == 5 and result.last_seq == 5 and result.head_hash == got[-1].row_hash


async def test_an_entry_is_appended_once_per_source_event(ledger):
    e = charge()
    first = await append(ledger.conn, "ledger_entries", e, unique="source_event")
    again = await append(ledger.conn, "ledger_entries", {**e, "amount_minor": 9}, unique="source_event")
    assert again == first
    assert await ledger.conn.fetchval("SELECT count(*) FROM ledger_entries") == 1


async def test_a_value_postgres_would_not_return_as_written_is_refused_at_append(ledger):
    with pytest.raises((ChainError, TypeError)):
        await append(ledger.conn, "ledger_entries", charge(entry={"rate": 0.1}))
    assert await ledger.conn.fetchval("SELECT count(*) FROM ledger_entries") == 0


async def test_a_batch_is_one_run_of_the_chain_and_skips_what_is_already_there(ledger):
    there = await append(ledger.conn, "ledger_entries", charge(), unique="source_event")
    again = charge()
    batch = [charge(1), {**charge(2), "source_event": (await ledger.conn.fetchval(
        "SELECT source_event FROM ledger_entries"))}, again, charge(3, created_at=dt.datetime(2026, 1, 2, tzinfo=dt.UTC)),
        {**again, "amount_minor": 9}]
    async with ledger.conn.transaction():
        got = await append_many(ledger.conn, "ledger_entries", batch, unique="source_event")
    assert [a.seq for a in got] == [2, 1, 3, 4, 3] and got[1] == there and got[4] == got[2]
    rows = await ledger.conn.fetch("SELECT * FROM ledger_entries ORDER BY seq")
    assert [r["amount_minor"] for r in rows] == [1250, 1, 1250, 3]
    assert rows[3]["created_at"] == dt.datetime(2026, 1, 2, tzinfo=dt.UTC)
    assert [bytes(r["row_hash"]) for r in rows] == [there.row_hash, *(a.row_hash for a in got[:1] + got[2:4])]
    assert (await verify(ledger.conn, "ledger_entries")).ok
    assert await append_many(ledger.conn, "ledger_entries", []) == []
    with pytest.raises(ValueError, match="no column nope"):
        await append_many(ledger.conn, "ledger_entries", [charge(nope=1)])


async def test_the_head_and_keys_read_is_planned_for_its_keys_in_every_append(ledger):
    """A connection that appended while the table was a few rows keeps no plan made for it then (a scan of the
    whole table as it grows, under the chain's lock): the read is planned for its keys each time."""
    for _ in range(8):   # more than the five runs after which PostgreSQL may keep a generic plan
        async with ledger.conn.transaction():
            await append_many(ledger.conn, "ledger_entries", [charge(), charge()], unique="source_event")
    plans = await ledger.conn.fetchrow("SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                                      "WHERE statement LIKE '(SELECT true AS head%ledger_entries%'")
    assert plans["generic_plans"] == 0 and plans["custom_plans"] >= 8
    assert await ledger.conn.fetchval("SHOW plan_cache_mode") == "auto"   # transaction-local: gone after it


async def test_a_batch_holding_a_value_postgres_would_not_return_as_written_writes_nothing(ledger):
    with pytest.raises((ChainError, TypeError)):
        await append_many(ledger.conn, "ledger_entries", [charge(), charge(entry={"rate": 0.1})])
    assert await ledger.conn.fetchval("SELECT count(*) FROM ledger_entries") == 0
    await ledger.conn.execute("CREATE TABLE padded (seq bigint PRIMARY KEY, code char(5), prev_hash bytea, "
                              "row_hash bytea)")
    with pytest.raises(ChainError, match="padded seq 2"):   # char(5) pads what it is given: stored ≠ hashed
        await append_many(ledger.conn, "padded", [{"code": "ABCDE"}, {"code": "AB"}])
    assert await ledger.conn.fetchval("SELECT count(*) FROM padded") == 0


async def test_a_batch_refused_inside_the_callers_transaction_can_only_be_rolled_back(ledger):
    """No savepoint of its own: a refused batch leaves the caller's transaction failed, so its rows are not
    committed even when the caller carries on past the error."""
    await ledger.conn.execute("CREATE TABLE padded (seq bigint PRIMARY KEY, code char(5), prev_hash bytea, "
                              "row_hash bytea)")
    tx = ledger.conn.transaction()
    await tx.start()
    with pytest.raises(ChainError, match="padded seq 2"):
        await append_many(ledger.conn, "padded", [{"code": "ABCDE"}, {"code": "AB"}])
    with pytest.raises(asyncpg.InFailedSQLTransactionError):
        await ledger.conn.execute("SELECT 1")
    await tx.rollback()
    assert await ledger.conn.fetchval("SELECT count(*) FROM padded") == 0
    async with ledger.conn.transaction():    # and a batch that is not refused runs in the caller's transaction
        await append_many(ledger.conn, "padded", [{"code": "ABCDE"}])
        assert await ledger.conn.fetchval("SELECT count(*) FROM padded") == 1
        assert ledger.conn.is_in_transaction()


async def test_rows_as_postgres_returns_them_encode_to_their_canonical_bytes(ledger):
    await append_many(ledger.conn, "ledger_entries", [charge(i, entry={
        "note": text, "nested": {"z": [text, None, 2 ** 62], "a": True}}) for i, text in enumerate(
        ["Zürich", '"q"\\', "ctl\x01\x1f", "nl\n", "🚀", ""])])
    stmt = await ledger.conn.prepare("SELECT * FROM ledger_entries ORDER BY seq")
    encoder = RowEncoder([(a.name, a.type.name) for a in stmt.get_attributes()])
    for r in await stmt.fetch():
        assert encoder.encode(r) == canonical({**dict(r.items()), "entry": json.loads(r["entry"])})


async def test_a_checkpoint_over_a_later_range_is_judged_over_its_own_rows(ledger):
    await fill(ledger, 6)
    hashes = [bytes(r["row_hash"]) for r in await ledger.conn.fetch("SELECT row_hash FROM ledger_entries ORDER BY seq")]
    await ledger.tamper("INSERT INTO ledger_entries_checkpoints (tree_size, first_seq, last_seq, root_hash) "
                        "VALUES (3, 3, 5, $1), (2, 5, 6, $2)", merkle_root(hashes[2:5]), bytes(32))
    result = await verify(ledger.conn, "ledger_entries")
    assert result.bad_entry_count == 0 and result.checkpoints == 2
    assert [(c.first_seq, c.last_seq) for c in result.bad_checkpoints] == [(5, 6)]


async def test_concurrent_appends_from_many_connections_stay_one_linear_chain(ledger):
    conns = [await ledger.service_conn() for _ in range(20)]
    try:
        start = asyncio.Event()

        async def writer(conn: asyncpg.Connection) -> list[int]:
            await start.wait()
            return [(await append(conn, "ledger_entries", charge())).seq for _ in range(5)]

        tasks = [asyncio.create_task(writer(c)) for c in conns]
        t0 = time.perf_counter()
        start.set()
        seqs = [s for got in await asyncio.gather(*tasks) for s in got]
        elapsed = time.perf_counter() - t0
    finally:
        for c in conns:
            await c.close()
    assert sorted(seqs) == list(range(1, 101))
    result = await verify(ledger.conn, "ledger_entries")
    assert result.ok and result.entries == 100, result.to_json()
    print(f"100 appends from 20 connections: {elapsed * 1000:.0f} ms ({100 / elapsed:.0f}/s)")


@pytest.mark.parametrize("table", ["ledger_entries", "ledger_entries_checkpoints"])
@pytest.mark.parametrize("statement", ["UPDATE {t} SET created_at = now()", "DELETE FROM {t}", "TRUNCATE {t}"])
async def test_the_service_role_cannot_change_or_remove_rows(ledger, table, statement):
    await fill(ledger, 2)
    await checkpoint(ledger.conn, "ledger_entries")
    with pytest.raises(asyncpg.InsufficientPrivilegeError, match="permission denied"):
        await ledger.conn.execute(statement.format(t=table))


@pytest.mark.parametrize("table", ["ledger_entries", "ledger_entries_checkpoints"])
@pytest.mark.parametrize("statement", ["UPDATE {t} SET created_at = now()", "DELETE FROM {t}", "TRUNCATE {t}"])
async def test_the_triggers_refuse_changes_from_a_role_that_holds_the_privilege(ledger, table, statement):
    await fill(ledger, 2)
    await checkpoint(ledger.conn, "ledger_entries")
    with pytest.raises(asyncpg.InsufficientPrivilegeError, match=f"{table} is append-only: {statement.split()[0]} refused"):
        await ledger.admin.execute(statement.format(t=f"{ledger.schema}.{table}"))


async def test_a_row_a_superuser_alters_behind_the_triggers_is_named_by_verify(ledger):
    await fill(ledger, 6)
    cp = await checkpoint(ledger.conn, "ledger_entries")
    await ledger.tamper("UPDATE ledger_entries SET amount_minor = 1 WHERE seq = 3")
    result = await verify(ledger.conn, "ledger_entries")
    assert not result.ok
    assert [f.seq for f in result.bad_entries] == [3]
    assert "row_hash" in result.first_bad_entry.problems[0] and len(result.first_bad_entry.problems) == 1
    assert result.first_bad_checkpoint.id == cp.id


async def test_a_row_altered_and_rehashed_breaks_the_next_link_and_the_checkpoint(ledger):
    await fill(ledger, 6)
    cp = await checkpoint(ledger.conn, "ledger_entries")
    r = await ledger.conn.fetchrow("SELECT * FROM ledger_entries WHERE seq = 3")
    forged = {**dict(r.items()), "entry": json.loads(r["entry"]), "amount_minor": 1}
    await ledger.tamper("UPDATE ledger_entries SET amount_minor = 1, row_hash = $1 WHERE seq = 3",
                        row_hash(bytes(r["prev_hash"]), forged))
    result = await verify(ledger.conn, "ledger_entries")
    assert [f.seq for f in result.bad_entries] == [4]
    assert "prev_hash" in result.first_bad_entry.problems[0]
    assert [c.id for c in result.bad_checkpoints] == [cp.id] and "root_hash" in result.first_bad_checkpoint.problem


async def test_a_deleted_middle_row_is_found_as_a_gap(ledger):
    await fill(ledger, 5)
    cp = await checkpoint(ledger.conn, "ledger_entries")
    await ledger.tamper("DELETE FROM ledger_entries WHERE seq = 3")
    result = await verify(ledger.conn, "ledger_entries")
    assert [f.seq for f in result.bad_entries] == [4]
    assert any("seq gap: expected 3, found 4" in p for p in result.first_bad_entry.problems)
    assert any("prev_hash" in p for p in result.first_bad_entry.problems)
    assert result.first_bad_checkpoint.id == cp.id


async def test_a_tampered_checkpoint_is_named_by_verify(ledger):
    await fill(ledger, 3)
    first = await checkpoint(ledger.conn, "ledger_entries")
    await fill(ledger, 4)
    second = await checkpoint(ledger.conn, "ledger_entries")
    assert (first.tree_size, second.tree_size, second.first_seq, second.last_seq) == (3, 7, 1, 7)
    assert (await verify(ledger.conn, "ledger_entries")).ok
    await ledger.tamper("UPDATE ledger_entries_checkpoints SET root_hash = $1 WHERE id = $2", bytes(32), first.id)
    result = await verify(ledger.conn, "ledger_entries")
    assert result.bad_entry_count == 0 and result.checkpoints == 2
    assert [c.id for c in result.bad_checkpoints] == [first.id]


async def test_checkpoints_are_idempotent_and_refuse_a_broken_chain(ledger):
    assert await checkpoint(ledger.conn, "ledger_entries") is None
    await fill(ledger, 3)
    a = await checkpoint(ledger.conn, "ledger_entries")
    assert await checkpoint(ledger.conn, "ledger_entries") == a
    await ledger.tamper("UPDATE ledger_entries SET currency = 'USD' WHERE seq = 2")
    with pytest.raises(ChainError, match="seq 2"):
        await checkpoint(ledger.conn, "ledger_entries")


async def ledger_verify(*args: str) -> tuple[int, list[str], str]:
    """Run the command as `./taskw ledger:verify` does: (exit status, stdout lines, stderr)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TESSERA_DATABASE_URL", "TESSERA_DATA_DIR")}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "tooling.ledger_verify", *args, cwd=ROOT, env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    return proc.returncode, out.decode().splitlines(), err.decode()


async def test_the_verify_command_ends_with_one_json_line_and_fails_on_tampering(ledger, infra):
    await fill(ledger, 4)
    await checkpoint(ledger.conn, "ledger_entries")
    status, lines, _ = await ledger_verify("--data", str(infra.workdir), "--table", ledger.table)   # the embedded server
    report = json.loads(lines[-1])
    assert status == 0 and report["ok"] and report["tables"][0]["entries"] == 4, lines
    assert "INTACT" in lines[0]
    await ledger.tamper("UPDATE ledger_entries SET entry = entry || '{\"quantity\": \"0.5\"}' WHERE seq = 2")
    status, lines, _ = await ledger_verify("--dsn", infra.admin_dsn, "--table", ledger.table)
    report = json.loads(lines[-1])["tables"][0]
    assert status == 1 and not report["ok"] and report["bad_entries"] == [2]
    assert report["first_bad_entry"]["seq"] == 2 and report["first_bad_checkpoint"]["last_seq"] == 4
    assert any(line.startswith("  entry seq 2:") for line in lines)


async def test_the_verify_command_cannot_check_a_missing_table(infra):
    status, lines, err = await ledger_verify("--dsn", infra.admin_dsn, "--table", "nowhere.ledger_entries")
    assert status == 2 and json.loads(lines[-1])["ok"] is False and "cannot check" in err
