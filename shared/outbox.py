"""Transactional outbox: the writer (inside the caller's transaction) and the relay.

A unit of work hands the rows it committed to its own process's relay, which publishes them at once
without reading them back. Nothing else wakes the relay (no LISTEN/NOTIFY: PostgreSQL signals every
listening backend of the database on each NOTIFY, whatever its channel, and with a relay listening in
every service and node-agent that cost more than the rest of a small transaction); once a second it also
looks in the table, for rows written outside a unit of work and rows a crashed replica left.

The table pass never tracks "the last id seen": ids and sequence numbers are taken
before commit, so a row that commits late with a lower number would be skipped.
It publishes every row not yet marked published, locks rows with SKIP LOCKED so
several relays (replicas) never publish the same row concurrently, and uses
Nats-Msg-Id = outbox id so a row re-published after a crash (published, not yet
marked) is dropped by the server's duplicate window.
"""
from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from typing import NamedTuple

import asyncpg
import structlog
from nats.js import JetStreamContext
from pydantic import BaseModel

from . import fairness
from .contract import Catalog, ContractViolation
from .envelope import Envelope, utcnow
from .observability import PUBLISHED, inject_trace

log = structlog.get_logger()

_DRAINED_KEPT = 10_000   # ids of rows the table pass published, remembered for their hand-over
_HANDED_IN_FLIGHT = 8    # hand-overs whose acks the relay awaits at once (each sent in order, as it came)
INBOX_RETENTION_DAYS = 8   # > the streams' max_age (shared.streams): no redelivery can be older


# outbox rows (id, subject, type, headers JSON, body) in one statement; {} for each column's array parameter
INSERT_ROWS = ("INSERT INTO outbox (id, subject, type, headers, body) "
               "SELECT * FROM unnest({}::uuid[], {}::text[], {}::text[], {}::jsonb[], {}::bytea[])")


class Row(NamedTuple):
    """An outbox row as the relay publishes it."""

    id: uuid.UUID
    subject: str
    headers: dict[str, str]
    body: bytes


class Outbox:
    """Writes events and commands to the service's outbox table in the caller's transaction."""

    def __init__(self, service: str, catalog: Catalog):
        self.service = service
        self.catalog = catalog
        # the runtime points this at its relay: rows a unit of work committed, to publish at once
        self.hand_over: Callable[[list[Row]], None] = lambda rows: None

    def envelope(self, type_: str, data: BaseModel, *, correlation_id: str, tenant_id: uuid.UUID | None,
                 causation: Envelope | None) -> Envelope:
        msg = self.catalog.message(type_)
        if not isinstance(data, msg.model):
            raise ContractViolation(f"{type_} carries {msg.model.__name__}, not {type(data).__name__}")
        trace = inject_trace()
        caused_tenant = causation.tenant_id if causation else None
        tenant = tenant_id if tenant_id is not None else caused_tenant
        # the tenant's weight travels with its messages: inherited from the cause of the same tenant, else
        # what this process knows of it (the gateway's table; nothing elsewhere: the default)
        weight = causation.weight if causation and tenant == caused_tenant else fairness.weights.get(tenant)
        return Envelope(
            id=uuid.uuid4(), type=type_, schema_version=msg.version, occurred_at=utcnow(),
            tenant_id=tenant, weight=weight,
            correlation_id=str(correlation_id), causation_id=causation.id if causation else None,
            traceparent=trace.get("traceparent"), tracestate=trace.get("tracestate"),
            data=data.model_dump(mode="json"),
        )

    async def add(self, conn: asyncpg.Connection, type_: str, data: BaseModel, *, correlation_id: str,
                  tenant_id: uuid.UUID | None = None, causation: Envelope | None = None,
                  subject_params: dict[str, str] | None = None) -> Envelope:
        """Queue one message; it is published only if the caller's transaction commits (by the relay's next
        look at the table: a unit of work's ``emit`` publishes at once)."""
        [env] = await self.add_many(conn, [(type_, data, subject_params)], correlation_id=correlation_id,
                                    tenant_id=tenant_id, causation=causation)
        return env

    async def add_many(self, conn: asyncpg.Connection, items: list[tuple[str, BaseModel, dict[str, str] | None]], *,
                       correlation_id: str, tenant_id: uuid.UUID | None = None,
                       causation: Envelope | None = None, sink: list[Row] | None = None,
                       pending: list[tuple] | None = None) -> list[Envelope]:
        """Queue several messages (type, payload, subject params) in one statement, in order.
        Every one is checked against the contracts before anything is written. The rows are also appended
        to ``sink`` (a unit of work hands them to its relay once committed). With ``pending``, nothing is
        written yet: the rows are appended to it, for one ``insert`` of a whole batch before its commit."""
        rows, envelopes = [], []
        for type_, data, params in items:
            subject = self.catalog.message(type_).render_subject(**(params or {}))
            self.catalog.check_send(self.service, type_, subject)
            env = self.envelope(type_, data, correlation_id=correlation_id, tenant_id=tenant_id, causation=causation)
            envelopes.append(env)
            headers = env.headers()
            rows.append((env.id, subject, type_, json.dumps(headers), env.model_dump_json().encode()))
            if sink is not None:
                sink.append(Row(env.id, subject, headers, rows[-1][4]))
        if pending is not None:
            pending.extend(rows)
        else:
            await self.insert(conn, rows)
        return envelopes

    @staticmethod
    async def insert(conn: asyncpg.Connection, rows: list[tuple]) -> None:
        """Write outbox rows (id, subject, type, headers JSON, body), in order, in one statement."""
        if rows:
            await conn.execute(INSERT_ROWS.format("$1", "$2", "$3", "$4", "$5"), *(list(c) for c in zip(*rows)))


class OutboxRelay:
    """Publishes committed outbox rows to JetStream: those handed over at once, the table every ``poll_s``."""

    def __init__(self, pool: asyncpg.Pool, js: JetStreamContext, service: str, *, batch: int = 256,
                 poll_s: float = 1.0, retention_s: float = 3600.0, scope: tuple[str, str] | None = None,
                 mark_delay_s: float = 0.05):
        """``scope`` (``shared.bus_identity.publish_scope``): (prefix, suffix): of the rows whose subject starts
        with prefix, the table pass takes only those ending with suffix (a node-agent: its own node's; another
        node's rows are its agent's to publish, the server refuses them from anyone else). ``mark_delay_s``: how
        long handed-over rows, once published, may wait to be marked, so that the rows of many transactions are
        marked in one statement (``flush_marks``)."""
        self.pool, self.js, self.service = pool, js, service
        self.batch, self.poll_s, self.retention_s = batch, poll_s, retention_s
        self.scope, self.mark_delay_s = scope, mark_delay_s
        self._unmarked: dict[uuid.UUID, None] = {}   # published, not marked yet
        self._mark_at = 0.0
        self._wake = asyncio.Event()
        self._handed: list[Row] = []
        # rows the table pass published before their hand-over reached the relay (committed, not yet
        # handed): their hand-over is skipped, not published twice
        self._drained: dict[uuid.UUID, None] = {}
        # hand-overs sent whose acks are awaited (a burst of one transaction, e.g. the scheduler's quota use,
        # does not hold up the rows committed after it), and the rows they carry (the table pass leaves them)
        self._sending: set[asyncio.Task] = set()
        self._in_flight: dict[uuid.UUID, None] = {}
        self.published = 0

    def take(self, rows: list[Row]) -> None:
        """Rows this process committed: publish them at once, without reading them back."""
        self._handed.extend(rows)
        self._wake.set()

    async def run(self) -> None:
        """Publish what is handed over as soon as it is; look in the table at start and every ``poll_s``,
        however busy (rows written outside a unit of work, or left by a crash or a failed publish)."""
        try:
            await self._run()
        finally:
            for task in list(self._sending):
                task.cancel()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_look = loop.time()
        next_purge = next_look + 600 * self.poll_s   # every ten minutes at the default poll
        while True:
            self._wake.clear()
            handed, self._handed = self._handed, []
            try:
                if handed:
                    await self._send(handed)
                if self._unmarked and (len(self._unmarked) >= self.batch or loop.time() >= self._mark_at):
                    await self.flush_marks()
                if loop.time() >= next_look:
                    await self.drain()
                    next_look = loop.time() + self.poll_s
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # NATS or PG unavailable: keep the rows, try again
                log.warning("outbox.publish_failed", error=repr(exc))
                await asyncio.sleep(self.poll_s)
                continue
            if loop.time() >= next_purge:
                await self.purge()
                next_purge = loop.time() + 600 * self.poll_s
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancellation that
            # arrives as a hand-over wakes us, and the relay (and Runtime.stop) would then run forever.
            wake_at = min(next_look, self._mark_at) if self._unmarked else next_look
            try:
                async with asyncio.timeout(max(0.0, wake_at - loop.time())):
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def _send(self, rows: list[Row]) -> None:
        """Publish a hand-over without waiting for its acks (``publish_handed`` in a task of its own, its
        messages sent in the order the hand-overs came), at most ``_HANDED_IN_FLIGHT`` at once. One that
        fails leaves its rows to the table pass, as a failed publish always did."""
        while len(self._sending) >= _HANDED_IN_FLIGHT:
            await asyncio.wait(self._sending, return_when=asyncio.FIRST_COMPLETED)
        ids = [r.id for r in rows]
        self._in_flight.update(dict.fromkeys(ids))

        async def send() -> None:
            try:
                await self.publish_handed(rows)
            except Exception as exc:   # noqa: BLE001 - NATS unavailable: the table pass publishes them later
                log.warning("outbox.publish_failed", error=repr(exc))
            finally:
                for i in ids:
                    self._in_flight.pop(i, None)
                self._wake.set()       # their marks are due

        task = asyncio.create_task(send())
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def publish_handed(self, rows: list[Row]) -> None:
        """Publish rows handed over after their commit, without reading them back, then mark them in one
        statement. Only committed rows are handed over (a unit of work drops the rows of a savepoint that
        rolled back), so nothing needs checking first; one this relay's table pass already published (it
        committed before the hand-over arrived) is skipped. Another replica's table pass may publish one of
        them too before it is marked: the server drops the second copy (Nats-Msg-Id = the row's id, within the
        streams' duplicate window). A crash before the mark leaves them for the table pass, the same way.
        The mark waits up to ``mark_delay_s`` (``run`` calls ``flush_marks``), to be one statement for the rows
        of many transactions: each mark is a transaction of its own, as many as the batches otherwise."""
        rows = [r for r in rows if self._drained.pop(r.id, self) is self]
        if rows:
            await self._publish(rows)
            if not self._unmarked:
                self._mark_at = asyncio.get_running_loop().time() + self.mark_delay_s
            self._unmarked.update(dict.fromkeys(r.id for r in rows))

    async def flush_marks(self) -> None:
        """Mark every row published and not marked yet, in one statement (kept for the next try if it fails)."""
        if self._unmarked:
            ids = list(self._unmarked)
            await self.mark_published(ids)
            for i in ids:
                self._unmarked.pop(i, None)

    async def mark_published(self, ids: list[uuid.UUID]) -> None:
        """Mark rows published in one round trip, without waiting for the WAL flush: a mark lost in a crash
        only has the row published again, which the server drops (and every consumer's inbox would)."""
        listed = ",".join(str(uuid.UUID(str(i))) for i in ids)   # UUIDs only: safe as a literal
        await self.pool.execute("SET LOCAL synchronous_commit = off; UPDATE outbox SET published_at = now() "
                                f"WHERE id = ANY('{{{listed}}}'::uuid[]) AND published_at IS NULL")

    async def drain(self) -> None:
        """Publish every unpublished row of the table, a batch at a time (first marking what this relay
        published, so that its table pass never finds those rows again)."""
        await self.flush_marks()
        while await self.drain_once() == self.batch:
            pass   # a full batch: there may be more; a partial one drained the table

    def _scoped(self, first: int) -> tuple[str, list]:
        """The table pass's filter on this relay's rows (``scope``), its parameters numbered from ``first``."""
        if not self.scope:
            return "", []
        a, b = f"${first}", f"${first + 1}"
        return f" AND (NOT starts_with(subject, {a}) OR right(subject, length({b})) = {b})", list(self.scope)

    async def drain_once(self) -> int:
        """Publish one batch from the table; returns how many rows were published.

        First one statement, outside any transaction, asks whether the table holds a row for this relay that it
        is not sending now: nearly always none, and the locked read below costs three round trips (it begins,
        reads, commits). A row that commits just after that look waits for the next pass, as one committing
        just after the locked read always did."""
        scoped, args = self._scoped(2)
        if not await self.pool.fetchval(
                f"SELECT EXISTS (SELECT 1 FROM outbox WHERE published_at IS NULL{scoped} AND id <> ALL($1::uuid[]))",
                list(self._in_flight), *args):
            return 0
        args = [self.batch, *args]
        async with self.pool.acquire() as conn, conn.transaction():
            rows = [Row(r["id"], r["subject"], json.loads(r["headers"]), bytes(r["body"])) for r in await conn.fetch(
                f"SELECT id, subject, headers, body FROM outbox WHERE published_at IS NULL{scoped} "
                "ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED", *args)]
            rows = [r for r in rows if r.id not in self._in_flight]   # a hand-over is sending them
            if not rows:
                return 0
            await self._publish(rows)
            await conn.execute("UPDATE outbox SET published_at = now() WHERE id = ANY($1::uuid[])", [r.id for r in rows])
        self._drained.update(dict.fromkeys(r.id for r in rows))
        for stale in list(self._drained)[:max(0, len(self._drained) - _DRAINED_KEPT)]:
            del self._drained[stale]   # rows never handed over (written outside a unit of work, by a crashed replica)
        return len(rows)

    async def _publish(self, rows: list[Row]) -> None:
        """Publish in order on one connection; the acks are awaited together."""
        await asyncio.gather(*(self.js.publish(r.subject, r.body, headers=r.headers, timeout=10) for r in rows))
        PUBLISHED.labels(self.service).inc(len(rows))
        self.published += len(rows)

    async def purge(self) -> None:
        """Forget published outbox rows after ``retention_s``, and inbox rows once JetStream can no
        longer redeliver their message (the streams keep messages for 7 days; we keep 8)."""
        async with self.pool.acquire() as conn:
            await conn.execute("DELETE FROM outbox WHERE published_at < now() - make_interval(secs => $1)", self.retention_s)
            await conn.execute("DELETE FROM inbox WHERE processed_at < now() - make_interval(days => $1)", INBOX_RETENTION_DAYS)
