"""The ledger's rows checked from COPY text (shared/chain_text.py): PostgreSQL's text output of each covered
type gives the canonical bytes shared.chain gives for the driver's value, COPY's escapes are undone, values
outside what is decoded are refused (the walk then reads records), and a run of rows is checked for content,
links and seqs, its first row left to the caller."""
from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import uuid

import pytest

from shared.chain import GENESIS, canonical, leaf_hash, row_hash
from shared.chain_text import Unsupported, check, supported, text_encoder, unescape

COLUMNS = (("seq", "int8"), ("note", "text"), ("at", "timestamptz"), ("prev_hash", "bytea"),
           ("row_hash", "bytea"), ("doc", "jsonb"))
AT = dt.datetime(2026, 1, 2, 3, 4, 5, 120000, tzinfo=dt.UTC)


def test_the_text_of_each_covered_type_encodes_as_the_drivers_value_does():
    columns = (("seq", "int8"), ("t", "text"), ("c", "bpchar"), ("n", "int4"), ("b", "bool"), ("f", "boolean"),
               ("ts", "timestamptz"), ("j", "jsonb"), ("jt", "json"), ("u", "uuid"), ("raw", "bytea"),
               ("prev_hash", "bytea"), ("row_hash", "bytea"))
    u = uuid.UUID("6f1c2b4e-0000-4000-8000-00000000abcd")
    fields = ["-7", "tab\\there \\\\N \\n\\r\\b\\f\\v Zürich \"q\"", "US ", "\\N", "t", "f",
              "2026-01-02 03:04:05.12+00", '{"b": [1, null, true], "a": "x\\\\"y\\\\\\\\", "ab": {"z": "\\\\u0001"}}',
              ' [ "a" ,  {"b": 1, "a": 2} ] ', str(u), "\\\\x00ff5c", "\\\\x" + "00" * 32, "\\\\x" + "11" * 32]
    expected = canonical({"seq": -7, "t": "tab\there \\N \n\r\b\f\v Zürich \"q\"", "c": "US ", "n": None,
                          "b": True, "f": False, "ts": AT,
                          "j": {"b": [1, None, True], "a": 'x"y\\', "ab": {"z": "\x01"}},
                          "jt": ["a", {"b": 1, "a": 2}], "u": u, "raw": b"\x00\xff\\"})
    assert text_encoder(columns)(fields) == expected


@pytest.mark.parametrize("text, value", [
    ("2026-01-02 03:04:05+00", dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)),
    ("2026-01-02 03:04:05.5+00", dt.datetime(2026, 1, 2, 3, 4, 5, 500000, tzinfo=dt.UTC)),
    ("2026-01-02 03:04:05.000001+00", dt.datetime(2026, 1, 2, 3, 4, 5, 1, tzinfo=dt.UTC)),
    ("1000-01-01 00:00:00.01+00", dt.datetime(1000, 1, 1, 0, 0, 0, 10000, tzinfo=dt.UTC)),
    ("9999-12-30 23:59:59.999999+00", dt.datetime(9999, 12, 30, 23, 59, 59, 999999, tzinfo=dt.UTC)),
])
def test_timestamps_in_utc_iso_output_encode_as_the_datetimes_do(text, value):
    assert text_encoder((("ts", "timestamptz"),))([text]) == canonical({"ts": value})


@pytest.mark.parametrize("column, text", [
    ("timestamptz", "0999-01-02 03:04:05+00"), ("timestamptz", "10000-01-02 03:04:05+00"),
    ("timestamptz", "2026-01-02 03:04:05+00 BC"), ("timestamptz", "infinity"),
    ("timestamptz", "2026-01-02 04:04:05+01"), ("bytea", "\\\\001\\\\002"), ("bool", "yes"), ("text", "a\\qb"),
])
def test_text_outside_what_is_decoded_is_refused_not_guessed(column, text):
    with pytest.raises(Unsupported):
        text_encoder((("v", column),))([text])


def test_copy_escapes_are_undone_and_plain_text_is_left_as_it_is():
    assert unescape("a\\\\b\\tc\\nd\\re\\bf\\fg\\vh") == "a\\b\tc\nd\re\bf\fg\vh"
    assert unescape("plain") == "plain"


def test_only_tables_whose_every_hashed_column_is_covered_go_the_text_way():
    assert supported(COLUMNS)
    assert not supported(COLUMNS + (("amount", "numeric"),))
    assert not supported(COLUMNS + (("ratio", "float8"),))
    assert not supported(tuple(c for c in COLUMNS if c[0] != "row_hash"))


def lines(n: int, edit=None) -> tuple[bytes, list[bytes]]:
    """n chained rows as COPY text and their row hashes; ``edit(seq, fields, prev, digest)`` may change what a
    row's line says after it is hashed."""
    prev, out, hashes = GENESIS, [], []
    for seq in range(1, n + 1):
        fields = {"seq": seq, "note": f"row {seq}\tok", "at": AT, "doc": {"k": seq, "a": [seq]}}
        digest = row_hash(prev, fields)
        line = {"seq": str(seq), "note": f"row {seq}\\tok", "at": "2026-01-02 03:04:05.12+00",
                "prev_hash": "\\\\x" + prev.hex(), "row_hash": "\\\\x" + digest.hex(),
                "doc": f'{{"a": [{seq}], "k": {seq}}}'}
        if edit:
            edit(seq, line)
        out.append("\t".join(line[name] for name, _ in COLUMNS))
        hashes.append(digest)
        prev = digest
    return ("\n".join(out) + "\n").encode(), hashes


def test_a_run_of_intact_rows_has_no_findings_and_gives_its_ends():
    data, hashes = lines(5)
    checked = check(COLUMNS, data, 100, True)
    assert (checked.rows, checked.bad, checked.findings) == (5, 0, [])
    assert checked.first == (1, GENESIS, hashes[0], hashes[0])
    assert (checked.last_seq, checked.last_hash, checked.max_seq) == (5, hashes[4], 5)
    assert checked.seqs == [1, 2, 3, 4, 5] and checked.leaves == [leaf_hash(h) for h in hashes]
    assert check(COLUMNS, data, 100, False).seqs is None


def test_rows_after_the_first_are_judged_on_content_link_and_seq_and_counted_past_the_limit():
    def edit(seq, line):
        if seq in (1, 3):
            line["note"] = "changed"            # content: its row_hash no longer matches
        if seq == 5:
            line["seq"] = "7"                   # a gap
    data, hashes = lines(6, edit)
    checked = check(COLUMNS, data, 1, False)
    assert checked.first[0] == 1 and checked.first[3] != hashes[0]   # left to the caller to judge
    assert checked.bad == 3 and len(checked.findings) == 1           # rows 3, 7 (seq 5 renumbered) and 6
    seq, expected, stored_prev, prev_stored, stored, recomputed = checked.findings[0]
    assert (seq, expected, stored_prev, prev_stored, stored) == (3, 3, hashes[1], hashes[1], hashes[2])
    assert recomputed == hashlib.sha256(hashes[1] + text_encoder(COLUMNS)(data.decode().split("\n")[2].split("\t"))).digest()
    assert [f[:2] for f in check(COLUMNS, data, 10, False).findings] == [(3, 3), (7, 5), (6, 8)]
    assert check(COLUMNS, data, 10, False).max_seq == 7


def test_a_null_hash_is_refused():
    data, _ = lines(2, lambda seq, line: line.update(prev_hash="\\N") if seq == 2 else None)
    with pytest.raises(Unsupported):
        check(COLUMNS, data, 10, False)


async def test_slices_checked_while_the_stream_waited_are_judged_in_order_without_a_backlog(monkeypatch):
    """The stream over an executor (threads here): three slices wait behind a gate while the stream, one slice
    past its backlog, waits for the first; once they are all checked, each is judged once, in order."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from shared import ledger_copy
    from tests.support.polling import eventually

    gate, started = threading.Event(), []

    def gated(*args):
        started.append(args)
        gate.wait(10)
        return check(*args)
    monkeypatch.setattr(ledger_copy, "SLICE_BYTES", 1)
    monkeypatch.setattr(ledger_copy, "workers", lambda: 1)      # a backlog of 2 slices
    monkeypatch.setattr(ledger_copy, "check", gated)
    data, hashes = lines(6)
    judged = []
    with ThreadPoolExecutor(6) as pool:
        stream = ledger_copy._Stream(COLUMNS, judged.append, True, 10, pool)

        async def feed():
            for line in data.splitlines(keepends=True):
                await stream.take(line)
        feeder = asyncio.create_task(feed())
        await eventually(lambda: len(started), until=lambda n: n == 3, timeout=10)   # the feeder waits for the 1st
        gate.set()
        await feeder
        await stream.finish()
    assert stream.failed is None
    assert [c.first[0] for c in judged] == [1, 2, 3, 4, 5, 6]
    assert [c.first[2] for c in judged] == hashes
