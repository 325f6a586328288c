"""Verifying a hash-chained table (shared/ledger_store.py): one streaming pass over its rows in seq order
that recomputes every row hash, checks every link and seq, and grows the Merkle trees its checkpoints are
compared with. Reads only; memory does not grow with the table.

Two ways, with the same findings in the same order: the rows as COPY text, hashed in slices by worker
processes (shared/ledger_copy.py, shared/chain_text.py) when every column's type is one chain_text decodes;
otherwise, or when a value is outside what it decodes, the rows as driver records through a cursor
(shared.chain.RowEncoder: the canonical bytes straight from the driver's values)."""
from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import asyncpg

from shared.chain import GENESIS, RowEncoder, TreeBuilder, leaf_hash
from shared.chain_text import Checked, supported
from shared.ledger_copy import walk_copy

MAX_FINDINGS = 100             # problems listed per verify (the first ones; counts are exact)


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


CHUNK = 1_000    # rows a fetch of the walk's cursor: small enough to sit in the socket's buffers while hashed


async def _chunks(cursor: asyncpg.cursor.Cursor) -> AsyncIterator[list[asyncpg.Record]]:
    """The cursor's rows, CHUNK at a time, each next fetch sent before the caller gets the current chunk:
    PostgreSQL reads and sends the next rows while this process hashes the current ones, instead of
    each side waiting for the other (the connection still runs one command at a time)."""
    ahead = asyncio.ensure_future(cursor.fetch(CHUNK))
    try:
        while rows := await ahead:
            ahead = asyncio.ensure_future(cursor.fetch(CHUNK))
            await asyncio.sleep(0)   # let the fetch go out before the caller's hashing holds the loop
            yield rows
    finally:
        if not ahead.done():
            ahead.cancel()


async def walk(conn: asyncpg.Connection, table: str, result: VerifyResult,
               checkpoints: list[Checkpoint], whole: TreeBuilder | None = None) -> None:
    """Stream the rows of ``table`` (its quoted name) in seq order (a server-side cursor, CHUNK rows a
    fetch), recording problems in ``result``: a seq gap, a prev_hash not equal to the previous row's stored
    row_hash, a row_hash not equal to the hash of the row's content. Each checkpoint is compared when the
    walk passes its last_seq, over the recomputed hashes (the checkpoint vouches for the content, not for
    the stored hash column). The COPY text way first (see the module docstring), the records' if it steps
    aside."""
    stmt = await conn.prepare(f"SELECT * FROM {table} ORDER BY seq")
    columns = tuple((a.name, a.type.name) for a in stmt.get_attributes())
    if supported(columns) and await _walk_copy(conn, table, columns, result, checkpoints, whole):
        return
    names = [name for name, _ in columns]
    i_seq, i_prev, i_hash = names.index("seq"), names.index("prev_hash"), names.index("row_hash")
    encode, sha256 = RowEncoder(columns).encode, hashlib.sha256
    marks = _Marks(checkpoints, result, whole)
    expected, prev_stored, stored = 1, GENESIS, None
    async for rows in _chunks(await stmt.cursor()):
        for rec in rows:
            seq, stored_prev, stored = rec[i_seq], rec[i_prev], rec[i_hash]
            recomputed = sha256(stored_prev + encode(rec)).digest()
            if seq != expected or stored_prev != prev_stored or recomputed != stored:
                _bad_entry(result, seq, expected, stored_prev, prev_stored, stored, recomputed)
            marks.add(seq, recomputed)
            expected, prev_stored = seq + 1, stored
        result.entries += len(rows)
        result.last_seq = expected - 1
    result.head_hash = stored
    marks.end()


async def _walk_copy(conn: asyncpg.Connection, table: str, columns: tuple[tuple[str, str], ...],
                     result: VerifyResult, checkpoints: list[Checkpoint], whole: TreeBuilder | None) -> bool:
    """``walk`` over COPY text, the rows hashed in slices (shared/ledger_copy.py); here each slice's first row
    is judged against the previous slice's last, its own findings are recorded after it, and the leaf hashes
    of its recomputed hashes grow the checkpoints' trees. Into a fresh result and tree, copied to ``result``/``whole`` only when
    the whole table was read this way; False (nothing changed) when it could not be."""
    trial, tree = VerifyResult(result.table, checkpoints=result.checkpoints), TreeBuilder()
    marks = _Marks(checkpoints, trial, tree if whole is not None else None)
    link = [1, GENESIS]   # the next slice's expected first seq and prev_hash

    def judge(checked: Checked) -> None:
        if checked.first is None:
            return
        (seq, stored_prev, stored, recomputed), (expected, prev_stored) = checked.first, link
        if seq != expected or stored_prev != prev_stored or recomputed != stored:
            _bad_entry(trial, seq, expected, stored_prev, prev_stored, stored, recomputed)
        for finding in checked.findings:
            _bad_entry(trial, *finding)
        trial.bad_entry_count += checked.bad - len(checked.findings)
        if checked.seqs is not None:
            marks.add_run(checked.seqs, checked.leaves, checked.max_seq)
        trial.entries += checked.rows
        trial.last_seq, trial.head_hash = checked.last_seq, checked.last_hash
        link[:] = [checked.last_seq + 1, checked.last_hash]

    keep = bool(checkpoints) or whole is not None
    if not await walk_copy(conn, table, columns, judge, keep, MAX_FINDINGS):
        return False
    marks.end()
    vars(result).update(vars(trial))
    if whole is not None:
        vars(whole).update(vars(tree))
    return True


def _bad_entry(result: VerifyResult, seq: int, expected: int, stored_prev: bytes, prev_stored: bytes,
               stored: bytes, recomputed: bytes) -> None:
    problems = []
    if seq != expected:
        problems.append(f"seq gap: expected {expected}, found {seq} ({seq - expected} row(s) missing)"
                        if seq > expected else f"seq out of order: expected {expected}, found {seq}")
    if stored_prev != prev_stored:
        problems.append(f"prev_hash {stored_prev.hex()[:16]}… is not the previous row's row_hash "
                        f"{prev_stored.hex()[:16]}…")
    if recomputed != stored:
        problems.append(f"row_hash {stored.hex()[:16]}… does not match the row's content "
                        f"(recomputed {recomputed.hex()[:16]}…)")
    result.bad_entry_count += 1
    if len(result.bad_entries) < MAX_FINDINGS:
        result.bad_entries.append(EntryFinding(seq, problems))


class _Marks:
    """The checkpoints a walk is to judge and the Merkle trees it grows for them. ``add`` calls ``before``
    only when a row's seq reaches ``before_at`` (a checkpoint starts there, or one ended before it) and
    ``after`` only when it reaches ``after_at`` (one ends there), so a row that starts or ends none costs two
    comparisons; ``trees`` lists the trees each row's recomputed hash is appended to."""

    def __init__(self, checkpoints: list[Checkpoint], result: VerifyResult, whole: TreeBuilder | None):
        self.pending = sorted(checkpoints, key=lambda c: (c.last_seq, c.id))
        self.result, self.by_start = result, {}
        self.trees: list[TreeBuilder] = [whole] if whole is not None else []
        self._starts = sorted({c.first_seq for c in self.pending})
        self._aim()

    def _aim(self) -> None:
        end = self.pending[0].last_seq if self.pending else float("inf")
        self.before_at = min(self._starts[0] if self._starts else float("inf"), end + 1)
        self.after_at = end

    def add(self, seq: int, recomputed: bytes) -> None:
        """Row ``seq``, whose content hashes to ``recomputed``, is read (rows in the order read)."""
        if self.trees or seq >= self.before_at:
            self.add_run((seq,), (leaf_hash(recomputed),), seq)
        elif seq >= self.after_at:
            self.after(seq)

    def add_run(self, seqs: Sequence[int], leaves: Sequence[bytes], last: int) -> None:
        """Rows read in this order, with these seqs (``last`` the highest) and their recomputed hashes' leaf
        hashes. A run that starts and ends no checkpoint goes into each tree in one call."""
        if last < self.before_at and last < self.after_at:
            for tree in self.trees:
                tree.extend_leaves(leaves)
            return
        for seq, leaf in zip(seqs, leaves):
            if seq >= self.before_at:
                self.before(seq)
            for tree in self.trees:
                tree.extend_leaves((leaf,))
            if seq >= self.after_at:
                self.after(seq)

    def before(self, seq: int) -> None:
        """Row ``seq`` is read: judge the checkpoints whose last row was never read, and start a tree for
        each checkpoint starting by this row."""
        while self.pending and self.pending[0].last_seq < seq:
            _judge(self.result, self.pending.pop(0), self.by_start, missing_last=True)
        while self._starts and self._starts[0] <= seq:
            self.by_start[self._starts[0]] = tree = TreeBuilder()
            self.trees.append(tree)
            self._starts.pop(0)
        self._aim()

    def after(self, seq: int) -> None:
        """Row ``seq``'s hash is in the trees: judge the checkpoints ending at it."""
        while self.pending and self.pending[0].last_seq == seq:
            _judge(self.result, self.pending.pop(0), self.by_start, missing_last=False)
        self._aim()

    def end(self) -> None:
        last = self.result.last_seq
        for c in self.pending:
            _bad_checkpoint(self.result, c, f"covers seq {c.first_seq}..{c.last_seq} but the table ends at "
                                            f"{last if last is not None else 'nothing'}")


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


