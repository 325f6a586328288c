"""Reading the event feed in ``seq`` order without losing an event committed out of order.

``allocation_events.seq`` is taken when a row is inserted and becomes visible when its transaction commits, so
two projections of different allocations can commit seq 10 before seq 9. A reader past 10 would skip 9 for good.
The reader therefore remembers each seq missing below what it has read (a rolled-back insert also leaves one) for
``GAP_WAIT_S``, and delivers any of them that commits meanwhile, late and out of order. A projection transaction
lasts milliseconds, so a gap still open after that is a seq that will never be used.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import asyncpg

from ...adapters import event_feed as repo
from ...adapters.event_feed import FeedFilter
from ...http.sse import event_bytes, json_line

REPLAY_MAX = 10_000     # a resumed feed replays at most this many seqs, then goes live
PAGE = 500              # events per read
GAP_WAIT_S = 10.0       # how long a seq missing below the read position is looked for
GAPS_MAX = 2_000        # seqs remembered at once (a burst of rolled-back inserts must not grow this forever)


@dataclass
class FeedReader:
    """One feed's position: ``last_seq`` read (every seq up to it examined), the gaps still awaited."""

    feed: FeedFilter
    last_seq: int
    gaps: dict[int, float] = field(default_factory=dict)   # seq -> monotonic deadline

    @classmethod
    async def start(cls, conn: asyncpg.Connection, feed: FeedFilter, after: int | None) -> FeedReader:
        """From the newest event on (``after`` None: new events only), or after ``after``, replaying at most
        REPLAY_MAX seqs."""
        head = await repo.head_seq(conn)
        last = head if after is None else max(min(after, head), head - REPLAY_MAX, 0)
        return cls(feed, last)

    async def read(self, conn: asyncpg.Connection) -> tuple[list[asyncpg.Record], bool]:
        """The next events (late ones first), and whether more are waiting (read again at once). Its statements read
        one snapshot (a read-only repeatable-read transaction of its own: ``conn`` must hold none): a seq committed
        between the read of the events and the read of the seqs present would otherwise be neither delivered nor
        awaited."""
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            return await self._read(conn)

    async def _read(self, conn: asyncpg.Connection) -> tuple[list[asyncpg.Record], bool]:
        late = await self._late(conn)
        head = await repo.head_seq(conn)
        if head <= self.last_seq:
            return late, False
        upto = min(head, self.last_seq + PAGE * 4)
        rows = await repo.events_between(conn, self.last_seq, upto, self.feed, PAGE)
        if len(rows) == PAGE:
            upto = rows[-1]["seq"]
        self._note_gaps(await repo.seqs_between(conn, self.last_seq, upto), upto)
        self.last_seq = upto
        return late + rows, upto < head

    def _note_gaps(self, present: list[int], upto: int) -> None:
        deadline = time.monotonic() + GAP_WAIT_S
        seen = set(present)
        for seq in range(self.last_seq + 1, upto + 1):
            if seq not in seen and len(self.gaps) < GAPS_MAX:
                self.gaps[seq] = deadline

    async def _late(self, conn: asyncpg.Connection) -> list[asyncpg.Record]:
        if not self.gaps:
            return []
        now = time.monotonic()
        self.gaps = {s: d for s, d in self.gaps.items() if d > now}
        if not self.gaps:
            return []
        present, rows = await repo.late_events(conn, list(self.gaps), self.feed)
        for seq in present:
            self.gaps.pop(seq, None)
        return list(rows)


def feed_event(row: asyncpg.Record) -> bytes:
    """One SSE event of the feed: ``id`` the seq, ``event`` the type, ``data`` {seq, allocation_id, tenant_id, type,
    envelope} as compact JSON."""
    data = {"seq": row["seq"], "allocation_id": row["allocation_id"], "tenant_id": row["tenant_id"],
            "type": row["type"], "envelope": json.loads(row["envelope"])}
    return event_bytes(str(row["seq"]), row["type"], json_line(data))
