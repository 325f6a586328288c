"""Verify over COPY text (shared/ledger_copy.py, shared/chain_text.py) on real PostgreSQL: it finds exactly what
the record walk finds — the same findings, counts and order — on chains long enough to be cut into many slices
hashed by worker processes, with tampering inside a slice and across slice ends, and it steps aside for a value
it does not decode."""
from __future__ import annotations

import datetime as dt
import uuid

import pytest

from shared import ledger_copy, ledger_walk
from shared.chain import merkle_root
from shared.ledger_store import append_many, checkpoint, verify
from tests.integration.test_ledger_store import Ledger, charge
from tests.integration.test_ledger_store import ledger as ledger  # noqa: F401  (the fixture)


@pytest.fixture
def ways(monkeypatch):
    """Small slices and a low pool threshold (many slices, worker processes); records which way each walk
    took: True (COPY text), False (it stepped aside)."""
    monkeypatch.setattr(ledger_copy, "SLICE_BYTES", 4096)
    monkeypatch.setattr(ledger_copy, "POOL_MIN_ROWS", 500)
    monkeypatch.setattr(ledger_copy, "workers", lambda: 3)   # several workers, whatever this machine has
    taken: list[bool] = []
    pools: list[int] = []
    real_walk, real_pool = ledger_walk.walk_copy, ledger_copy._pool

    async def spy(*args, **kwargs):
        taken.append(await real_walk(*args, **kwargs))
        return taken[-1]

    def pool():
        pools.append(ledger_copy.workers())
        return real_pool()
    monkeypatch.setattr(ledger_walk, "walk_copy", spy)
    monkeypatch.setattr(ledger_copy, "_pool", pool)
    return taken, pools


async def by_records(conn, table: str, monkeypatch):
    """``verify`` the record way only."""
    with monkeypatch.context() as m:
        m.setattr(ledger_walk, "supported", lambda columns: False)
        return await verify(conn, table)


def findings(result) -> dict:
    return {**result.to_json(), "entries_found": [(f.seq, f.problems) for f in result.bad_entries],
            "checkpoints_found": [(c.id, c.problem) for c in result.bad_checkpoints]}


async def fill(ledger: Ledger, n: int, batch: int = 500) -> None:
    for start in range(0, n, batch):
        await append_many(ledger.conn, "ledger_entries", [charge(i) for i in range(start, min(n, start + batch))])


async def test_a_long_chain_is_checked_in_worker_processes_and_found_intact(ledger, ways):
    taken, pools = ways
    await fill(ledger, 3000)
    cp = await checkpoint(ledger.conn, "ledger_entries")
    hashes = [bytes(r["row_hash"]) for r in await ledger.conn.fetch("SELECT row_hash FROM ledger_entries ORDER BY seq")]
    assert (cp.tree_size, cp.root_hash) == (3000, merkle_root(hashes))
    result = await verify(ledger.conn, "ledger_entries")
    assert result.ok and (result.entries, result.last_seq, result.head_hash) == (3000, 3000, hashes[-1])
    assert taken == [True, True] and pools == [3, 3]


async def test_tampering_inside_and_across_slices_is_found_as_the_record_walk_finds_it(ledger, ways, monkeypatch):
    taken, pools = ways
    await fill(ledger, 3000)
    whole = await checkpoint(ledger.conn, "ledger_entries")
    await ledger.tamper("INSERT INTO ledger_entries_checkpoints (tree_size, first_seq, last_seq, root_hash) "
                        "VALUES (500, 2001, 2500, $1), (10, 2991, 3000, $1)", bytes(32))
    # 41 rows in a row edited (with ~13 rows a slice, several slices start or end among them), one deleted,
    # two swapped, and a first row changed
    await ledger.tamper("UPDATE ledger_entries SET amount_minor = amount_minor + 1 WHERE seq BETWEEN 1000 AND 1040")
    await ledger.tamper("DELETE FROM ledger_entries WHERE seq = 2000")
    await ledger.tamper("UPDATE ledger_entries SET seq = seq + 10000 WHERE seq IN (2500, 2501)")
    await ledger.tamper("UPDATE ledger_entries SET seq = CASE seq WHEN 12500 THEN 2501 ELSE 2500 END "
                        "WHERE seq > 10000")
    await ledger.tamper("UPDATE ledger_entries SET kind = 'correction' WHERE seq = 1")
    fast = await verify(ledger.conn, "ledger_entries")
    assert taken == [True, True] and pools
    expected = await by_records(ledger.conn, "ledger_entries", monkeypatch)
    assert findings(fast) == findings(expected)
    assert fast.bad_entry_count == 1 + 41 + 1 + 3 and fast.first_bad_entry.seq == 1
    assert whole.id in [c.id for c in fast.bad_checkpoints] and fast.bad_checkpoint_count == 3


async def test_more_bad_rows_than_are_listed_are_counted_exactly_across_slices(ledger, ways, monkeypatch):
    taken, _ = ways
    await fill(ledger, 1500)
    await ledger.tamper("UPDATE ledger_entries SET currency = 'USD' WHERE seq % 3 = 0")
    fast = await verify(ledger.conn, "ledger_entries")
    assert taken == [True]
    assert findings(fast) == findings(await by_records(ledger.conn, "ledger_entries", monkeypatch))
    assert fast.bad_entry_count == 500 and len(fast.bad_entries) == ledger_walk.MAX_FINDINGS


ODD = """CREATE TABLE odd (seq bigint PRIMARY KEY, t text, c char(5), v varchar(20), b boolean, i integer, s smallint,
    ts timestamptz, j jsonb, jt json, u uuid, raw bytea, prev_hash bytea NOT NULL, row_hash bytea NOT NULL,
    created_at timestamptz NOT NULL);
CREATE TABLE odd_checkpoints (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, tree_size bigint NOT NULL,
    first_seq bigint NOT NULL, last_seq bigint NOT NULL, root_hash bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(), UNIQUE (first_seq, last_seq))"""


def odd_rows() -> list[dict]:
    at = dt.datetime(2026, 3, 4, 5, 6, 7, tzinfo=dt.UTC)
    texts = ["plain", "tab\there", "line\nbreak\r\n", "back\\slash \\N \\x41", 'quote " and \' ', "Zürich ✓ 🚀",
             "\x01\x07\x08\x0b\x0c\x1f\x7f", "", "\\"]
    rows = []
    for k, text in enumerate(texts):
        rows.append({"t": text, "c": (text + "     ")[:5], "v": text[:20], "b": k % 2 == 0, "i": -k * 70000, "s": k,
                     "ts": at + dt.timedelta(microseconds=[0, 1, 120000, 999999][k % 4]),
                     "j": {"text": text, "nested": {"z": [1, None, True, {"ä": "b"}], "a": -12345678901234567890},
                           "quote": "\"\\/\n", "order": {"bb": 1, "a": 2, "ab": 3}},
                     "jt": [text, {"b": 1, "a": 2}], "u": uuid.uuid4(), "raw": bytes([k, 0, 255, 92, 10]),
                     "created_at": at})
    rows.append({"t": None, "c": None, "v": None, "b": None, "i": None, "s": None, "ts": None, "j": None,
                 "jt": None, "u": None, "raw": None,
                 "created_at": dt.datetime(9999, 12, 30, 23, 59, 59, 999999, tzinfo=dt.UTC)})
    return rows


async def test_values_copy_escapes_or_postgres_formats_hash_as_the_driver_values_do(ledger, ways, monkeypatch):
    taken, _ = ways
    await ledger.conn.execute(ODD)
    await append_many(ledger.conn, "odd", odd_rows())
    async with ledger.conn.transaction():   # the settings the text needs are put back for the caller's transaction
        await ledger.conn.execute("SET LOCAL TimeZone = 'Asia/Tokyo'; SET LOCAL bytea_output = 'escape'")
        cp = await checkpoint(ledger.conn, "odd")
        assert [await ledger.conn.fetchval(f"SHOW {s}") for s in ("TimeZone", "bytea_output")] == ["Asia/Tokyo", "escape"]
    assert cp.tree_size == 10 and (await verify(ledger.conn, "odd")).ok and taken == [True, True]
    # json keeps its text: whitespace and key order a superuser writes are not what is hashed
    await ledger.tamper("UPDATE odd SET jt = $1::json WHERE seq = 2", ' [ "tab\\there" , {"a": 2,  "b": 1} ] ')
    await ledger.tamper("UPDATE odd SET t = 'line\nbreak\r\n!' WHERE seq = 3")
    fast = await verify(ledger.conn, "odd")
    assert taken == [True, True, True]
    assert findings(fast) == findings(await by_records(ledger.conn, "odd", monkeypatch))
    assert [f.seq for f in fast.bad_entries] == [3]


async def test_a_value_the_text_is_not_decoded_from_is_verified_from_records(ledger, ways, monkeypatch):
    taken, _ = ways
    await ledger.conn.execute(ODD)
    rows = odd_rows()
    rows[1]["ts"] = dt.datetime(999, 1, 2, 3, 4, 5, tzinfo=dt.UTC)   # a year before 1000: not decoded from text
    await append_many(ledger.conn, "odd", rows)
    await ledger.tamper("UPDATE odd SET i = 5 WHERE seq = 4")
    result = await verify(ledger.conn, "odd")
    assert taken == [False] and [f.seq for f in result.bad_entries] == [4]
    assert findings(result) == findings(await by_records(ledger.conn, "odd", monkeypatch))
