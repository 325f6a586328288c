"""Hash-chained, append-only tables in PostgreSQL (asyncpg): append, checkpoint, verify.

Generic over the table, so the billing ledger and the gateway's audit log share it. A chained table has a
``seq bigint`` primary key (1, 2, 3 … without gaps), ``prev_hash bytea``, ``row_hash bytea`` and any other
columns; every column but the two hashes is covered by the row hash (shared/chain.py gives the rule). Its
Merkle checkpoints live in ``<table>_checkpoints`` (tree_size, first_seq, last_seq, root_hash, created_at).

Appends are serialised by a transaction-scoped advisory lock keyed by the table's oid: the next seq and the
previous row_hash are read under the lock and the lock is held until the caller's transaction ends, so two
appends can never read the same head (``LOCK TABLE … SHARE ROW EXCLUSIVE`` would do too, but it needs the
UPDATE/DELETE/TRUNCATE privilege the service role is denied). This needs READ COMMITTED (PostgreSQL's
default): under REPEATABLE READ a snapshot taken before the lock could read an old head; the seq primary key
then makes the insert fail rather than fork the chain.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import asyncpg

from shared.chain import GENESIS, RowEncoder, TreeBuilder, canonical_with_documents
from shared.ledger_walk import MAX_FINDINGS, Checkpoint, CheckpointFinding, EntryFinding, VerifyResult, walk

__all__ = ["MAX_FINDINGS", "Appended", "ChainError", "Checkpoint", "CheckpointFinding", "EntryFinding",
           "VerifyResult", "append", "append_many", "checkpoint", "quoted", "verify"]

_NAME = re.compile(r"^[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)?$")
_JSON = {"json", "jsonb"}
LOCK_CLASS = "tessera.chain"   # first key of the two-key advisory lock; the second is the table's oid


class ChainError(RuntimeError):
    """The chain cannot be extended or checkpointed: the table is missing, a row read back does not hash to
    what was written, or (checkpoint) the stored chain does not verify."""


class Appended(NamedTuple):
    seq: int
    row_hash: bytes


def quoted(table: str) -> str:
    """``table`` (``name`` or ``schema.name``, lowercase identifiers only) quoted for SQL; ValueError otherwise."""
    if not _NAME.match(table):
        raise ValueError(f"not a plain table name: {table!r}")
    return ".".join(f'"{part}"' for part in table.split("."))


async def _lock(conn: asyncpg.Connection, table: str) -> None:
    """Take the chain's lock, and have the rest of the transaction's statements planned for their arguments each
    time (``plan_cache_mode``, transaction-local): a connection otherwise keeps the plan it made for the head's
    and keys' read (``_head``) from its sixth run, until the table's statistics change, and a plan made while
    the table was a few rows scans it whole as it grows, under this lock."""
    found = await conn.fetchval(
        "SELECT true FROM set_config('plan_cache_mode', 'force_custom_plan', true), to_regclass($2) c, "
        "pg_advisory_xact_lock(hashtext($1), hashtext(c::oid::text)) WHERE c IS NOT NULL", LOCK_CLASS, table)
    if not found:
        raise ChainError(f"no table {table!r} (search_path: {await conn.fetchval('SHOW search_path')})")


async def append(conn: asyncpg.Connection, table: str, entry: dict[str, Any], *,
                 unique: str | None = None) -> Appended:
    """Append ``entry`` as the next row of ``table``; returns its seq and hash: ``append_many`` of one."""
    [appended] = await append_many(conn, table, [entry], unique=unique)
    return appended


async def append_many(conn: asyncpg.Connection, table: str, entries: list[dict[str, Any]], *,
                      unique: str | None = None) -> list[Appended]:
    """Append ``entries`` (each column → value, without seq and the hashes; ``created_at`` defaults to now
    in UTC when the table has it and the entry does not) as the next rows of ``table``, in order; returns
    each one's seq and hash. One lock, one head read, one hash pass and one INSERT per set of columns,
    however many entries: the lock is what serialises writers, so its cost is paid once per batch.

    Idempotent when ``unique`` names a column (e.g. ``source_event``): an entry whose value is already
    there (or earlier in ``entries``) gets that row's seq and hash and nothing is written for it. Runs in
    the caller's transaction, or its own when there is none (no savepoint: its release would be one more
    round trip under the lock); the lock it takes is held until that transaction ends, so commit soon.
    jsonb values are dicts or lists (written as canonical JSON). The rows are read back as stored and
    compared with what was hashed before the transaction can commit: a value PostgreSQL would not return
    byte for byte (a float in jsonb, an unpadded char(n)) raises ChainError instead of leaving a row verify
    would flag, and leaves the transaction failed (it can only roll back)."""
    if any({"seq", "prev_hash", "row_hash"} & e.keys() for e in entries):
        raise ValueError("seq, prev_hash and row_hash are the store's to set")
    if unique is not None and not _NAME.match(unique):
        raise ValueError(f"not a plain column name: {unique!r}")
    if not entries:
        return []
    async with contextlib.nullcontext() if conn.is_in_transaction() else conn.transaction():
        await _lock(conn, table)
        shape = await _shape(conn, table)
        known, head = await _head(conn, table, unique, entries)
        seq, prev = head
        out, rows, now = [], [], dt.datetime.now(dt.UTC)
        json_columns = shape.documents
        for entry in entries:
            if unknown := entry.keys() - shape.types.keys():
                raise ValueError(f"{table} has no column {', '.join(sorted(unknown))}")
            key = entry[unique] if unique is not None else None
            if key is not None and key in known:
                out.append(known[key])
                continue
            seq += 1
            fields = {k: _normalised(shape.types.get(k), v) for k, v in dict(entry, seq=seq).items()}
            if "created_at" in shape.types and "created_at" not in fields:
                fields["created_at"] = now
            body, documents = canonical_with_documents(fields, json_columns)
            digest = hashlib.sha256(prev + body).digest()
            out.append(Appended(seq, digest))
            rows.append(_Row({**fields, **documents}, body, prev, digest))
            prev = digest
            if key is not None:
                known[key] = out[-1]
        await _insert(conn, table, shape, rows)
        return out


async def _head(conn: asyncpg.Connection, table: str, unique: str | None,
                entries: list[dict[str, Any]]) -> tuple[dict[Any, Appended], tuple[int, bytes]]:
    """The rows already there whose ``unique`` column holds one of the entries' values, and the chain's
    head (seq, row_hash; 0 and GENESIS when empty): one statement, read after the lock is taken."""
    values = list({e[unique] for e in entries if e.get(unique) is not None}) if unique is not None else []
    sql = f"(SELECT true AS head, NULL AS key, seq, row_hash FROM {quoted(table)} ORDER BY seq DESC LIMIT 1)"
    if values:
        sql += f' UNION ALL SELECT false, "{unique}", seq, row_hash FROM {quoted(table)} WHERE "{unique}" = ANY($1)'
    rows = await conn.fetch(sql, *([values] if values else []))
    known = {r["key"]: Appended(r["seq"], bytes(r["row_hash"])) for r in rows if not r["head"]}
    return known, next(((r["seq"], bytes(r["row_hash"])) for r in rows if r["head"]), (0, GENESIS))


class _Row(NamedTuple):
    fields: dict[str, Any]   # as sent: json documents as the canonical text that was hashed
    body: bytes          # canonical(fields): what the hash covers
    prev_hash: bytes
    row_hash: bytes


async def _insert(conn: asyncpg.Connection, table: str, shape: _Shape, rows: list[_Row]) -> None:
    """Insert the hashed rows (one statement per set of columns) and compare each row as stored with the
    canonical bytes hashed for it."""
    groups: dict[tuple[str, ...], list[_Row]] = {}
    for row in rows:
        groups.setdefault(tuple(row.fields), []).append(row)
    for names, group in groups.items():
        columns = [*names, "prev_hash", "row_hash"]
        arrays = [[r.fields[n] for r in group] for n in names]
        arrays += [[r.prev_hash for r in group], [r.row_hash for r in group]]
        params = ", ".join(f"${i}::{shape.sql_types[n]}[]" for i, n in enumerate(columns, 1))
        stored = await conn.fetch(   # the connection's statement cache: parsed once per shape of batch
            f"INSERT INTO {quoted(table)} ({', '.join(_column(n) for n in columns)}) "
            f"SELECT * FROM unnest({params}) RETURNING *", *arrays)
        encoder = shape.encoder(tuple(stored[0].keys()))
        by_seq = {r["seq"]: r for r in stored}
        for row in group:
            if encoder.encode(by_seq[row.fields["seq"]]) != row.body:
                await _fail_transaction(conn)
                raise ChainError(f"{table} seq {row.fields['seq']}: the row as stored does not hash to what was "
                                 "written (a value PostgreSQL normalises, e.g. a float in jsonb or an unpadded "
                                 "char(n))")


async def _fail_transaction(conn: asyncpg.Connection) -> None:
    """Put the transaction in PostgreSQL's failed state: it can only roll back, so rows inserted in it are
    never committed, whatever the caller does with the error that follows."""
    try:
        await conn.execute("DO $$ BEGIN RAISE EXCEPTION 'a chained row does not hash to what was written'; END $$")
    except asyncpg.PostgresError:
        pass


def _column(name: str) -> str:
    if not _NAME.match(name) or "." in name:
        raise ValueError(f"not a plain column name: {name!r}")
    return f'"{name}"'


@dataclass
class _Shape:
    """A chained table's columns, read once per process: a chained table's columns come from the service's
    migrations, which run before its first append (an append on the hot path of every audited request must
    not ask the catalog each time)."""
    types: dict[str, str]         # name → type (format_type without modifier: what the hash rules key on)
    sql_types: dict[str, str]     # name → type with its modifier (character(3)): what values are cast to
    _encoders: dict[tuple[str, ...], RowEncoder] = field(default_factory=dict)

    @property
    def documents(self) -> set[str]:
        """The json/jsonb columns."""
        return {name for name, type_name in self.types.items() if type_name in _JSON}

    def encoder(self, names: tuple[str, ...]) -> RowEncoder:
        """The canonical encoder of rows with these columns, in this order."""
        if names not in self._encoders:
            self._encoders[names] = RowEncoder([(n, self.types.get(n, "")) for n in names])
        return self._encoders[names]


_SHAPES: dict[str, _Shape] = {}


async def _shape(conn: asyncpg.Connection, table: str) -> _Shape:
    cached = _SHAPES.get(table)
    if cached is not None:
        return cached
    rows = await conn.fetch("SELECT attname, format_type(atttypid, NULL) AS type, "
                            "format_type(atttypid, atttypmod) AS sql_type FROM pg_attribute "
                            "WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped", table)
    shape = _Shape({r["attname"]: r["type"] for r in rows}, {r["attname"]: r["sql_type"] for r in rows})
    if shape.types:
        _SHAPES[table] = shape
    return shape


def _normalised(type_name: str | None, value: Any) -> Any:
    """A uuid given as a string becomes a UUID, so it hashes the way PostgreSQL returns it (lowercase)."""
    if type_name == "uuid" and isinstance(value, str):
        return uuid.UUID(value)
    return value


async def _checkpoints(conn: asyncpg.Connection, table: str) -> list[Checkpoint]:
    rows = await conn.fetch(f"SELECT id, tree_size, first_seq, last_seq, root_hash, created_at "
                            f"FROM {quoted(table + '_checkpoints')} ORDER BY id")
    return [Checkpoint(**{**dict(r), "root_hash": bytes(r["root_hash"])}) for r in rows]


async def verify(conn: asyncpg.Connection, table: str) -> VerifyResult:
    """Recompute every row hash and link of ``table`` in seq order and every checkpoint's root. Reads only
    (one REPEATABLE READ, read-only transaction: rows and checkpoints from one snapshot); memory does not
    grow with the table."""
    result = VerifyResult(table)
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        checkpoints = await _checkpoints(conn, table)
        result.checkpoints = len(checkpoints)
        await walk(conn, quoted(table), result, checkpoints)
    return result


async def checkpoint(conn: asyncpg.Connection, table: str) -> Checkpoint | None:
    """Store (idempotently) a Merkle checkpoint over every row of ``table`` (seq 1..last) and return it;
    None when the table is empty. The root is computed in the same pass that verifies the chain (one cursor,
    one snapshot): a broken chain raises ChainError rather than being vouched for. It does not take the
    append lock (committed rows are always a prefix of the chain), so appends go on meanwhile."""
    result, tree = VerifyResult(table), TreeBuilder()
    async with conn.transaction():   # READ COMMITTED: committed rows are always a prefix of the chain
        await walk(conn, quoted(table), result, [], tree)
        if not result.ok:
            raise ChainError(f"{table}: not checkpointed, seq {result.first_bad_entry.seq}: "
                             f"{'; '.join(result.first_bad_entry.problems)}")
        if result.last_seq is None:
            return None
        cp = quoted(table + "_checkpoints")
        await conn.execute(f"INSERT INTO {cp} (tree_size, first_seq, last_seq, root_hash) VALUES ($1, 1, $2, $3) "
                           "ON CONFLICT (first_seq, last_seq) DO NOTHING", tree.size, result.last_seq, tree.root())
        row = await conn.fetchrow(f"SELECT id, tree_size, first_seq, last_seq, root_hash, created_at FROM {cp} "
                                  "WHERE first_seq = 1 AND last_seq = $1", result.last_seq)
    return Checkpoint(**{**dict(row), "root_hash": bytes(row["root_hash"])})
