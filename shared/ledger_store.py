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

import datetime as dt
import json
import re
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

import asyncpg

from shared.chain import GENESIS, TreeBuilder, canonical_json, row_hash

_NAME = re.compile(r"^[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)?$")
_JSON = {"json", "jsonb"}
LOCK_CLASS = "tessera.chain"   # first key of the two-key advisory lock; the second is the table's oid
MAX_FINDINGS = 100             # problems listed per verify (the first ones; counts are exact)


class ChainError(RuntimeError):
    """The chain cannot be extended or checkpointed: the table is missing, a row read back does not hash to
    what was written, or (checkpoint) the stored chain does not verify."""


class Appended(NamedTuple):
    seq: int
    row_hash: bytes


@dataclass(frozen=True)
class Checkpoint:
    id: int
    tree_size: int
    first_seq: int
    last_seq: int
    root_hash: bytes
    created_at: dt.datetime


@dataclass
class EntryFinding:
    seq: int
    problems: list[str]


@dataclass
class CheckpointFinding:
    id: int
    first_seq: int
    last_seq: int
    problem: str


@dataclass
class VerifyResult:
    """What ``verify`` found. ``bad_entries``/``bad_checkpoints`` list the first MAX_FINDINGS, in seq order;
    the counts are exact."""
    table: str
    entries: int = 0
    last_seq: int | None = None
    head_hash: bytes | None = None
    checkpoints: int = 0
    bad_entry_count: int = 0
    bad_checkpoint_count: int = 0
    bad_entries: list[EntryFinding] = field(default_factory=list)
    bad_checkpoints: list[CheckpointFinding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.bad_entry_count == 0 and self.bad_checkpoint_count == 0

    @property
    def first_bad_entry(self) -> EntryFinding | None:
        return self.bad_entries[0] if self.bad_entries else None

    @property
    def first_bad_checkpoint(self) -> CheckpointFinding | None:
        return self.bad_checkpoints[0] if self.bad_checkpoints else None

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.table, "ok": self.ok, "entries": self.entries, "last_seq": self.last_seq,
            "head_hash": self.head_hash.hex() if self.head_hash else None, "checkpoints": self.checkpoints,
            "bad_entry_count": self.bad_entry_count, "bad_checkpoint_count": self.bad_checkpoint_count,
            "first_bad_entry": asdict(self.first_bad_entry) if self.first_bad_entry else None,
            "first_bad_checkpoint": asdict(self.first_bad_checkpoint) if self.first_bad_checkpoint else None,
            "bad_entries": [f.seq for f in self.bad_entries],
            "bad_checkpoints": [f.id for f in self.bad_checkpoints],
        }


def quoted(table: str) -> str:
    """``table`` (``name`` or ``schema.name``, lowercase identifiers only) quoted for SQL; ValueError otherwise."""
    if not _NAME.match(table):
        raise ValueError(f"not a plain table name: {table!r}")
    return ".".join(f'"{part}"' for part in table.split("."))


def _fields(record: asyncpg.Record, json_columns: set[str]) -> dict[str, Any]:
    """A row as the values its hash covers (json columns decoded when no codec did it)."""
    out = dict(record.items())
    for name in json_columns & out.keys():
        if isinstance(out[name], str):
            out[name] = json.loads(out[name])
    return out


async def _lock(conn: asyncpg.Connection, table: str) -> None:
    found = await conn.fetchval(
        "SELECT true FROM to_regclass($2) c, pg_advisory_xact_lock(hashtext($1), hashtext(c::oid::text)) "
        "WHERE c IS NOT NULL", LOCK_CLASS, table)
    if not found:
        raise ChainError(f"no table {table!r} (search_path: {await conn.fetchval('SHOW search_path')})")


async def append(conn: asyncpg.Connection, table: str, entry: dict[str, Any], *,
                 unique: str | None = None) -> Appended:
    """Append ``entry`` (column → value, without seq and the hashes; ``created_at`` defaults to now in UTC
    when the table has it and the entry does not) as the next row of ``table``; returns its seq and hash.

    Idempotent when ``unique`` names a column (e.g. ``source_event``): a row with the same value already
    there is returned as is and nothing is written. Runs in a transaction (a savepoint inside the caller's);
    the lock it takes is held until the caller's transaction ends, so commit soon. jsonb values are dicts or
    lists (written as canonical JSON). The row is read back as stored and re-hashed before the transaction
    can commit: a value PostgreSQL would not return byte for byte (a float in jsonb, an unpadded char(n))
    raises ChainError instead of leaving a row verify would flag."""
    t = quoted(table)
    if {"seq", "prev_hash", "row_hash"} & entry.keys():
        raise ValueError("seq, prev_hash and row_hash are the store's to set")
    async with conn.transaction():
        await _lock(conn, table)
        if unique is not None:
            if not _NAME.match(unique):
                raise ValueError(f"not a plain column name: {unique!r}")
            done = await conn.fetchrow(f'SELECT seq, row_hash FROM {t} WHERE "{unique}" = $1', entry[unique])
            if done is not None:
                return Appended(done["seq"], bytes(done["row_hash"]))
        head = await conn.fetchrow(f"SELECT seq, row_hash FROM {t} ORDER BY seq DESC LIMIT 1")
        seq, prev = (head["seq"] + 1, bytes(head["row_hash"])) if head else (1, GENESIS)
        columns = await _columns(conn, table)
        fields = {k: _normalised(columns.get(k), v) for k, v in dict(entry, seq=seq).items()}
        if "created_at" in columns and "created_at" not in fields:
            fields["created_at"] = dt.datetime.now(dt.UTC)
        values = {k: canonical_json(v) if columns.get(k) in _JSON and v is not None else v for k, v in fields.items()}
        digest = row_hash(prev, fields)
        names = [*fields, "prev_hash", "row_hash"]
        stored = await conn.fetchrow(   # the connection's statement cache: parsed once per connection
            f"INSERT INTO {t} ({', '.join(f'{chr(34)}{n}{chr(34)}' for n in names)}) "
            f"VALUES ({', '.join(f'${i}' for i in range(1, len(names) + 1))}) RETURNING *", *values.values(), prev, digest)
        json_columns = {name for name, type_name in columns.items() if type_name in _JSON}
        if row_hash(prev, _fields(stored, json_columns)) != digest:
            raise ChainError(f"{table} seq {seq}: the row as stored does not hash to what was written "
                             "(a value PostgreSQL normalises, e.g. a float in jsonb or an unpadded char(n))")
        return Appended(seq, digest)


_COLUMN_TYPES: dict[str, dict[str, str]] = {}


async def _columns(conn: asyncpg.Connection, table: str) -> dict[str, str]:
    """The table's column types, read once per process: a chained table's columns come from the service's
    migrations, which run before its first append (an append on the hot path of every audited request must
    not ask the catalog each time)."""
    cached = _COLUMN_TYPES.get(table)
    if cached is not None:
        return cached
    rows = await conn.fetch("SELECT attname, format_type(atttypid, NULL) AS type FROM pg_attribute "
                            "WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped", table)
    found = {r["attname"]: r["type"] for r in rows}
    if found:
        _COLUMN_TYPES[table] = found
    return found


def _normalised(type_name: str | None, value: Any) -> Any:
    """A uuid given as a string becomes a UUID, so it hashes the way PostgreSQL returns it (lowercase)."""
    if type_name == "uuid" and isinstance(value, str):
        return uuid.UUID(value)
    return value


async def _walk(conn: asyncpg.Connection, table: str, result: VerifyResult,
                checkpoints: list[Checkpoint], whole: TreeBuilder | None = None) -> None:
    """Stream the rows in seq order (a server-side cursor), recording problems in ``result``: a seq gap, a
    prev_hash not equal to the previous row's stored row_hash, a row_hash not equal to the hash of the
    row's content. Each checkpoint is compared when the walk passes its last_seq, over the recomputed
    hashes (the checkpoint vouches for the content, not for the stored hash column)."""
    t = quoted(table)
    pending = sorted(checkpoints, key=lambda c: (c.last_seq, c.id))
    trees: dict[int, TreeBuilder] = {}
    expected, prev_stored = 1, GENESIS
    stmt = await conn.prepare(f"SELECT * FROM {t} ORDER BY seq")
    json_columns = {a.name for a in stmt.get_attributes() if a.type.name in _JSON}
    async for rec in stmt.cursor(prefetch=1000):
        seq, stored_prev, stored = rec["seq"], bytes(rec["prev_hash"]), bytes(rec["row_hash"])
        while pending and pending[0].last_seq < seq:
            _judge(result, pending.pop(0), trees, missing_last=True)
        problems = []
        if seq != expected:
            problems.append(f"seq gap: expected {expected}, found {seq} ({seq - expected} row(s) missing)"
                            if seq > expected else f"seq out of order: expected {expected}, found {seq}")
        if stored_prev != prev_stored:
            problems.append(f"prev_hash {stored_prev.hex()[:16]}… is not the previous row's row_hash "
                            f"{prev_stored.hex()[:16]}…")
        recomputed = row_hash(stored_prev, _fields(rec, json_columns))
        if recomputed != stored:
            problems.append(f"row_hash {stored.hex()[:16]}… does not match the row's content "
                            f"(recomputed {recomputed.hex()[:16]}…)")
        if problems:
            result.bad_entry_count += 1
            if len(result.bad_entries) < MAX_FINDINGS:
                result.bad_entries.append(EntryFinding(seq, problems))
        for c in pending:
            if c.first_seq <= seq and c.first_seq not in trees:
                trees[c.first_seq] = TreeBuilder()
        for tree in [*trees.values(), *([whole] if whole is not None else [])]:
            tree.append(recomputed)
        result.entries += 1
        result.last_seq, result.head_hash = seq, stored
        expected, prev_stored = seq + 1, stored
        while pending and pending[0].last_seq == seq:
            _judge(result, pending.pop(0), trees, missing_last=False)
    for c in pending:
        _bad_checkpoint(result, c, f"covers seq {c.first_seq}..{c.last_seq} but the table ends at "
                                   f"{result.last_seq if result.last_seq is not None else 'nothing'}")


def _judge(result: VerifyResult, c: Checkpoint, trees: dict[int, TreeBuilder], *, missing_last: bool) -> None:
    tree = trees.get(c.first_seq)
    if missing_last or tree is None:
        _bad_checkpoint(result, c, f"row {c.last_seq if missing_last else c.first_seq} it covers is missing")
    elif tree.size != c.tree_size:
        _bad_checkpoint(result, c, f"tree_size {c.tree_size} but {tree.size} rows in seq {c.first_seq}..{c.last_seq}")
    elif tree.root() != c.root_hash:
        _bad_checkpoint(result, c, f"root_hash {c.root_hash.hex()[:16]}… differs from the recomputed "
                                   f"{tree.root().hex()[:16]}… over {tree.size} rows")


def _bad_checkpoint(result: VerifyResult, c: Checkpoint, problem: str) -> None:
    result.bad_checkpoint_count += 1
    if len(result.bad_checkpoints) < MAX_FINDINGS:
        result.bad_checkpoints.append(CheckpointFinding(c.id, c.first_seq, c.last_seq, problem))


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
        await _walk(conn, table, result, checkpoints)
    return result


async def checkpoint(conn: asyncpg.Connection, table: str) -> Checkpoint | None:
    """Store (idempotently) a Merkle checkpoint over every row of ``table`` (seq 1..last) and return it;
    None when the table is empty. The root is computed in the same pass that verifies the chain (one cursor,
    one snapshot): a broken chain raises ChainError rather than being vouched for. It does not take the
    append lock (committed rows are always a prefix of the chain), so appends go on meanwhile."""
    result, tree = VerifyResult(table), TreeBuilder()
    async with conn.transaction():   # READ COMMITTED: committed rows are always a prefix of the chain
        await _walk(conn, table, result, [], tree)
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
