"""Durable JetStream consumers with an idempotent inbox, batches, bounded retries and a dead-letter stream.

Each consumer fetches what its stream holds for it (up to ``batch_size`` messages, waiting only when there is
nothing) and handles the batch in one PostgreSQL transaction:

1. each message's envelope and payload are checked against the contract; a malformed message goes straight to
   the dead-letter stream (retrying cannot fix it);
2. one statement records every message in the inbox (``unnest``); a message already there was handled before
   and has no second effect;
3. each new message's handler runs, its writes and outbox messages in the transaction; when one fails, the
   transaction is rolled back and the batch run again with each handler under a savepoint: the failing
   handler rolls back only itself (and its inbox row), its neighbours' work stays;
4. one commit, then the after-commit callbacks of the handlers that succeeded, then the acks.

A crash after the commit and before the acks redelivers the batch, and the inbox turns each message into a
duplicate. A failed handler is retried with backoff (nak with delay) up to ``max_deliver`` deliveries, then
moved to the dead-letter stream and acknowledged, so the messages behind it keep flowing. An error no retry can
fix (``permanent``: PermanentError, invalid data, an unknown reference) is not retried: when the subscription
declares ``on_refused``, that callback publishes the refusal in a new transaction that also records the inbox
row (a redelivery has no second effect); without one the message is dead-lettered at once.

Order: a consumer handles a batch in stream order, and runs ``max_workers`` batches at once, so two messages
may be handled out of order (and across replicas always may). No handler relies on delivery order: each is
written against the state it reads under a row lock (a saga's step records, a view that only moves forward, a
version number on network maps).
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
import structlog
from faststream.nats import NatsBroker
from nats.aio.msg import Msg
from nats.js.api import AckPolicy as JsAckPolicy
from nats.js.api import ConsumerConfig
from opentelemetry import trace
from pydantic import ValidationError

from .settings import BusSettings
from .contract import Catalog, ContractViolation, Message
from .envelope import Envelope
from .observability import DEAD_LETTERS, HANDLER_SECONDS, MESSAGES, extract_trace
from .outbox import Outbox
from .steps import Step
from .streams import DEAD_LETTER_PREFIX
from .unit_of_work import UnitOfWork

log = structlog.get_logger()
_TRACER = trace.get_tracer("tessera")   # resolves to the provider the runtime sets at start


def _header_safe(text: str, limit: int = 1000) -> str:
    """One printable ASCII line: NATS headers are not MIME, and some readers decode anything else oddly."""
    return "".join(c if " " <= c <= "~" else " " for c in text)[:limit]


class PermanentError(Exception):
    """The message can never be handled (bad reference, contract breach): refuse it now, never retry it."""


Handler = Callable[[UnitOfWork, Any], Awaitable[None]]
Refusal = Callable[[UnitOfWork, Any, str], Awaitable[None]]   # (new unit of work, the payload, the reason)

# What no retry can fix: an explicit refusal; a payload or document that fails validation; data PostgreSQL
# refuses (class 22: NUL or an unencodable character in text, a string too long, a number out of range, bad
# text for a type...; asyncpg raises DataError too for an argument it cannot encode); a reference to a row
# that does not exist. Everything else (connection lost, serialization failure, deadlock, a unique race, a
# bug that a deploy fixes) is retried.
PERMANENT_ERRORS: tuple[type[BaseException], ...] = (
    PermanentError, ValidationError, asyncpg.DataError, asyncpg.ForeignKeyViolationError)


def permanent(exc: BaseException) -> bool:
    """True when retrying the message cannot help (see ``PERMANENT_ERRORS``)."""
    return isinstance(exc, PERMANENT_ERRORS)


def text_safe(text: str, limit: int = 1000) -> str:
    """``text`` as PostgreSQL text and jsonb can store it (a NUL is written ``\\x00``), at most ``limit``
    characters: a refusal's reason may quote the very input that was refused."""
    return text.replace("\x00", "\\x00")[:limit]


def refusal_reason(exc: BaseException, limit: int = 1000) -> str:
    """The reason a permanent error gives, for whoever sent the command (one line, storable)."""
    if isinstance(exc, PermanentError):
        text = str(exc)
    elif isinstance(exc, ValidationError):
        problems = "; ".join(f"{'.'.join(str(x) for x in e['loc']) or e.get('type', '')}: {e['msg']}"
                             for e in exc.errors(include_url=False, include_input=False))
        text = f"invalid data ({exc.title}): {problems}"
    elif isinstance(exc, asyncpg.PostgresError):
        what = "unknown reference" if isinstance(exc, asyncpg.ForeignKeyViolationError) else "invalid data"
        detail = getattr(exc, "detail", None)
        text = f"{what} ({type(exc).__name__}): {exc}" + (f" ({detail})" if detail else "")
    else:
        text = f"{type(exc).__name__}: {exc}"
    return text_safe(" ".join(text.split()), limit)


class _HandlerFailed(Exception):
    """A handler failed in a batch run without savepoints: roll the batch back, run it again with them."""


@dataclass(eq=False)
class _Item:
    """One message of a batch and what became of it."""

    raw: Msg
    env: Envelope
    data: Any
    outcome: Any = None       # "ok", "duplicate", or the exception its handler raised
    committed: bool = False   # the batch's transaction committed


class _Subscription:
    """One durable pull consumer: what it consumes, how, and (while it runs) its fetch loop."""

    def __init__(self, name: str, subject: str, stream: str, msg: Message, handler: Handler,
                 on_refused: Refusal | None, batch: int, workers: int, config: Callable[[], ConsumerConfig],
                 exclusive: bool = False):
        self.name, self.subject, self.stream, self.msg = name, subject, stream, msg
        self.handler, self.on_refused = handler, on_refused
        self.batch, self.workers, self.config, self.exclusive = batch, workers, config, exclusive
        self.pull: Any = None                       # the nats-py pull subscription while running
        self.pump: asyncio.Task | None = None
        self.inflight: set[asyncio.Task] = set()


class Consumers:
    """Contract-checked durable pull consumers, each fetching batches and handling each batch in one transaction.

    A ``leader_only`` subscriber does not start with the others: ``start_leader_only`` starts it once the
    bus is connected, ``stop_leader_only`` stops it (messages in flight finish first); a replica calls them
    as it gains and loses leadership, as often as it does.

    ``exclusive`` subscribers run one batch at a time between them, holding ``self.exclusive`` (a service's
    own loops may take it too): for a service whose handlers keep state in memory that must follow the
    database one transaction at a time (the scheduler's index), and whose batches would otherwise lock the
    same rows in different orders.
    """

    def __init__(self, service: str, broker: NatsBroker, catalog: Catalog, outbox: Outbox,
                 settings: BusSettings, pool_getter: Callable[[], asyncpg.Pool]):
        self.service, self.broker, self.catalog, self.outbox = service, broker, catalog, outbox
        self.settings = settings
        self._pool = pool_getter
        self.names: list[str] = []
        self._always: list[_Subscription] = []
        self._leader_only: list[_Subscription] = []
        self._running: list[_Subscription] = []
        self.exclusive = asyncio.Lock()

    def subscribe(self, type_: str, handler: Handler, *, subject_params: dict[str, str] | None = None,
                  durable: str | None = None, max_workers: int | None = None, batch_size: int | None = None,
                  leader_only: bool = False, on_refused: Refusal | None = None, exclusive: bool = False) -> str:
        """Consume ``type_`` with ``handler``. ``on_refused(ctx, data, reason)`` publishes the service's refusal
        when the handler fails for a reason no retry can fix (``permanent``): it runs in a new unit of work
        (the handler's rolled back) that also records the inbox row, then the message is acknowledged.
        Without it such a message is dead-lettered at once.

        ``batch_size`` messages at most are handled in one transaction (1 for a handler that does slow
        work outside the database, e.g. a driver call), ``max_workers`` such transactions at once."""
        msg = self.catalog.check_receive(self.service, type_)
        subject = msg.render_subject(**subject_params) if subject_params else msg.wildcard()
        name = durable or f"{self.service}__{type_.replace('.', '_')}"

        def config() -> ConsumerConfig:   # a new one each time: nats-py fills in names on the one it is given
            return ConsumerConfig(
                ack_policy=JsAckPolicy.EXPLICIT, ack_wait=self.settings.ack_wait_s,
                max_deliver=self.settings.max_deliver + 1,  # the server's own cap sits above ours; we dead-letter
                max_ack_pending=1000)

        sub = _Subscription(name, subject, self.catalog.owner(type_).stream, msg, handler, on_refused,
                            batch=batch_size or self.settings.batch_size,
                            workers=max_workers or self.settings.max_workers, config=config, exclusive=exclusive)
        (self._leader_only if leader_only else self._always).append(sub)
        self.names.append(name)
        return name

    def participate(self, step: Step, *, invoke: Handler, undo: Handler | None = None,
                    subject_params: dict[str, str] | None = None, durable: str | None = None,
                    max_workers: int | None = None, batch_size: int | None = None,
                    leader_only: bool = False, exclusive: bool = False) -> list[str]:
        """Subscribe a participant to a declared saga step: ``invoke`` handles its command, ``undo`` its undo
        command (given exactly when the step has one). ``durable``, if given, prefixes the consumer names
        (``<durable>__<command name>``)."""
        if (undo is None) != (step.undo is None):
            raise ContractViolation(f"{step.command.type}: an undo handler goes with an undo command, and only then")
        return [self.subscribe(msg.type, handler, subject_params=subject_params, max_workers=max_workers,
                               batch_size=batch_size, durable=durable and f"{durable}__{msg.name}",
                               leader_only=leader_only, exclusive=exclusive)
                for msg, handler in ((step.command, invoke), (step.undo, undo)) if msg is not None]

    # --- running ----------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start every subscriber that is not leader-only (the bus must be connected)."""
        await self._start_all(self._always)

    async def stop(self) -> None:
        """Stop every running subscriber; the batches in flight finish first."""
        running, self._running = self._running, []
        for sub in running:
            await self._stop(sub)

    async def start_leader_only(self) -> None:
        """Start the leader-only subscribers (the bus must be connected)."""
        if not any(sub in self._running for sub in self._leader_only):
            await self._start_all(self._leader_only)

    async def stop_leader_only(self) -> None:
        """Stop the leader-only subscribers (messages in flight finish first)."""
        for sub in self._leader_only:
            if sub in self._running:
                self._running.remove(sub)
                await self._stop(sub)

    async def _start_all(self, subs: list[_Subscription]) -> None:
        try:
            for sub in subs:
                sub.pull = await self.broker.connection.jetstream().pull_subscribe(
                    sub.subject, durable=sub.name, stream=sub.stream, config=sub.config())
                sub.pump = asyncio.create_task(self._pump(sub), name=f"consume {sub.name}")
                self._running.append(sub)
        except BaseException:
            for sub in subs:      # all or none: a later call starts them all again
                if sub in self._running:
                    self._running.remove(sub)
                    await self._stop(sub)
            raise

    async def _stop(self, sub: _Subscription) -> None:
        if sub.pump is not None:
            sub.pump.cancel()
            with contextlib.suppress(BaseException):
                await sub.pump
        if sub.inflight:
            await asyncio.wait(list(sub.inflight), timeout=self.settings.ack_wait_s)
        if sub.pull is not None:
            with contextlib.suppress(Exception):
                await sub.pull.unsubscribe()
        sub.pump, sub.pull = None, None

    async def _pump(self, sub: _Subscription) -> None:
        """Fetch what is there (up to a batch; a long poll of ``fetch_wait_s`` when nothing is) whenever a
        worker is free, and hand each batch to a worker. A message arriving during the poll is delivered at
        once; the poll's length only sets how often an idle consumer asks."""
        free = asyncio.Semaphore(sub.workers)
        while True:
            await free.acquire()
            try:
                batch = await self._fetch(sub)
            except TimeoutError:   # nothing arrived (nats-py raises its own subclass, or asyncio's)
                free.release()
                continue
            except asyncio.CancelledError:
                free.release()
                raise
            except Exception as exc:   # reconnecting, server unavailable: the messages stay on the server
                free.release()
                log.warning("consumer.fetch_failed", consumer=sub.name, error=repr(exc))
                await asyncio.sleep(0.5)
                continue
            task = asyncio.create_task(self._handle(sub, batch))
            sub.inflight.add(task)
            task.add_done_callback(lambda t: (sub.inflight.discard(t), free.release()))

    async def _fetch(self, sub: _Subscription) -> list[Msg]:
        """One message, waiting for it at most ``fetch_wait_s``; then, without waiting, up to a batch of those
        the server already holds for this consumer (the message's ``num_pending`` says how many).

        Not one ``fetch(batch)``: a pull request for a batch that finds fewer messages stays open on the server
        until it expires, and nats-py's fetch waits for the rest of the batch until then, so a lone message
        could wait the whole poll."""
        first = await sub.pull.fetch(1, timeout=self.settings.fetch_wait_s)
        more = min(sub.batch - len(first), first[-1].metadata.num_pending or 0) if first else 0
        if more > 0:
            with contextlib.suppress(TimeoutError):   # another replica took them meanwhile
                first += await sub.pull.fetch(more, timeout=0.05)
        return first

    # --- one batch --------------------------------------------------------------------------------------

    async def _handle(self, sub: _Subscription, raws: list[Msg]) -> None:
        try:
            items = [item for raw in raws if (item := await self._parse(sub, raw)) is not None]
            if not items:
                return
            heartbeat = asyncio.create_task(self._heartbeat([i.raw for i in items]))
            try:
                if sub.exclusive:
                    async with self.exclusive:
                        await self._run_batch(sub, items)
                else:
                    await self._run_batch(sub, items)
            except Exception as exc:   # the batch's own transaction failed (connection lost, commit refused)
                log.warning("consumer.batch_failed", consumer=sub.name, messages=len(items), error=repr(exc))
                for item in items:
                    if not item.committed:
                        item.outcome = exc
            finally:
                heartbeat.cancel()
            await self._settle(sub, items)
        except Exception as exc:   # noqa: BLE001 - never let a batch kill the pump; the server redelivers
            log.error("consumer.batch_crashed", consumer=sub.name, error=repr(exc))

    async def _parse(self, sub: _Subscription, raw: Msg) -> _Item | None:
        """The message's envelope and payload, checked against the contract; a malformed message is
        dead-lettered at once (retrying cannot fix it)."""
        try:
            env = Envelope.model_validate_json(raw.data)
            if env.type != sub.msg.type:
                raise PermanentError(f"envelope type {env.type} on a {sub.msg.type} subject")
            return _Item(raw, env, sub.msg.model.model_validate(env.data))
        except (ValidationError, PermanentError, ValueError) as exc:
            await self.dead_letter(raw, sub.name, "invalid", str(exc)[:2000])
            return None

    async def _run_batch(self, sub: _Subscription, items: list[_Item]) -> None:
        """One transaction for the batch: one inbox insert for every message, each new message's handler,
        commit; then the after-commit callbacks of those that succeeded.

        The first attempt runs the handlers without savepoints (the usual batch, where every handler
        succeeds, pays for none). When a handler fails, that transaction is rolled back whole, and a batch
        of several is run again with each handler under a savepoint: a failing one rolls back only itself
        (its inbox row is removed), its neighbours' work commits. (A handler must therefore keep state
        outside the database to its after-commit callbacks, or be able to find it stale: it may run twice
        before anything commits.)"""
        try:
            await self._attempt(sub, items, isolated=False)
        except _HandlerFailed:
            if len(items) > 1:
                await self._attempt(sub, items, isolated=True)

    async def _attempt(self, sub: _Subscription, items: list[_Item], *, isolated: bool) -> None:
        done: list[UnitOfWork] = []
        async with self._pool().acquire() as conn:
            async with conn.transaction():
                fresh = {r[0] for r in await conn.fetch(
                    "INSERT INTO inbox (consumer, event_id) SELECT $1, unnest($2::uuid[]) "
                    "ON CONFLICT DO NOTHING RETURNING event_id", sub.name, [i.env.id for i in items])}
                failed = []
                for item in items:
                    item.outcome = None
                    if item.env.id not in fresh:
                        item.outcome = "duplicate"    # handled before (or earlier in this batch)
                        continue
                    fresh.discard(item.env.id)
                    uow = UnitOfWork(conn, self.outbox, name=sub.name, causation=item.env)
                    try:
                        if isolated:
                            async with conn.transaction():     # a savepoint
                                await self._call(sub, item, uow)
                        else:
                            await self._call(sub, item, uow)
                    except Exception as exc:
                        item.outcome = exc
                        if not isolated:
                            raise _HandlerFailed from exc   # rolls the whole transaction back
                        failed.append(item.env.id)
                        continue
                    item.outcome = "ok"
                    done.append(uow)
                if failed:
                    await conn.execute("DELETE FROM inbox WHERE consumer=$1 AND event_id = ANY($2::uuid[])",
                                       sub.name, failed)
            for item in items:
                item.committed = True
        for uow in done:
            await uow.run_after_commit()

    async def _call(self, sub: _Subscription, item: _Item, uow: UnitOfWork) -> None:
        """The handler, in the message's trace and log context."""
        env = item.env
        structlog.contextvars.bind_contextvars(correlation_id=env.correlation_id,
                                               tenant_id=str(env.tenant_id) if env.tenant_id else None)
        started = time.perf_counter()
        try:
            with _TRACER.start_as_current_span(f"{self.service} handle {sub.msg.type}",
                                                context=extract_trace(item.raw.headers),
                                                kind=trace.SpanKind.CONSUMER) as span:
                if span.is_recording():
                    span.set_attribute("messaging.message.id", str(env.id))
                    span.set_attribute("tessera.correlation_id", env.correlation_id)
                await sub.handler(uow, item.data)
        finally:
            HANDLER_SECONDS.labels(self.service, sub.msg.type).observe(time.perf_counter() - started)
            structlog.contextvars.unbind_contextvars("correlation_id", "tenant_id")

    async def _settle(self, sub: _Subscription, items: list[_Item]) -> None:
        """Ack what committed (and duplicates), then refuse or retry each failure on its own."""
        settled = [i for i in items if i.outcome in ("ok", "duplicate")]
        await asyncio.gather(*(i.raw.ack() for i in settled))
        for i in settled:
            MESSAGES.labels(self.service, sub.msg.type, i.outcome).inc()
        for item in items:
            exc = item.outcome
            if not isinstance(exc, BaseException):
                continue
            if permanent(exc):
                await self._refuse(sub, item, exc)
            else:
                await self._retry(item.raw, sub.name, sub.msg, exc)

    async def _once(self, consumer: str, env: Envelope, work: Callable[[UnitOfWork], Awaitable[None]]) -> bool:
        """Run ``work`` in a new unit of work that records ``env`` in ``consumer``'s inbox, then its after-commit
        hooks once committed; returns False, running nothing, when the inbox already holds ``env``."""
        async with self._pool().acquire() as conn, conn.transaction():
            fresh = await conn.fetchval(
                "INSERT INTO inbox (consumer, event_id) VALUES ($1, $2) ON CONFLICT DO NOTHING RETURNING 1",
                consumer, env.id)
            if fresh:
                uow = UnitOfWork(conn, self.outbox, name=consumer, causation=env)
                await work(uow)
        if fresh:
            await uow.run_after_commit()
        return bool(fresh)

    async def _retry(self, raw: Msg, consumer: str, msg: Message, exc: BaseException) -> None:
        """A failure a retry may fix: nak with backoff, or dead-letter once ``max_deliver`` deliveries failed."""
        delivered = raw.metadata.num_delivered
        MESSAGES.labels(self.service, msg.type, "error").inc()
        if delivered >= self.settings.max_deliver:
            log.error("consumer.gave_up", consumer=consumer, type=msg.type, deliveries=delivered, error=repr(exc))
            await self.dead_letter(raw, consumer, "max_deliveries", repr(exc)[:2000])
        else:
            backoff = self.settings.retry_backoff_s
            delay = backoff[min(delivered - 1, len(backoff) - 1)]
            log.warning("consumer.retry", consumer=consumer, type=msg.type, deliveries=delivered,
                        delay_s=delay, error=repr(exc))
            await raw.nak(delay=delay)

    async def _refuse(self, sub: _Subscription, item: _Item, exc: BaseException) -> None:
        """A failure no retry can fix (the handler's work rolled back): publish the refusal through
        ``on_refused`` in a new unit of work that records the inbox row, then ack; without a callback,
        dead-letter at once. A callback that fails is itself retried (a transient error) or dead-lettered."""
        raw, msg, on_refused = item.raw, sub.msg, sub.on_refused
        reason = refusal_reason(exc)
        log.warning("consumer.refused", consumer=sub.name, type=msg.type, reason=reason[:300],
                    deliveries=raw.metadata.num_delivered, published=on_refused is not None)
        if on_refused is None:
            MESSAGES.labels(self.service, msg.type, "refused").inc()
            await self.dead_letter(raw, sub.name, "rejected", reason)
            return
        heartbeat = asyncio.create_task(self._heartbeat([raw]))
        try:
            fresh = await self._once(sub.name, item.env, lambda uow: on_refused(uow, item.data, reason))
        except Exception as failed:
            heartbeat.cancel()
            if permanent(failed):
                MESSAGES.labels(self.service, msg.type, "refused").inc()
                await self.dead_letter(raw, sub.name, "rejected",
                                       f"{reason}; publishing the refusal failed too: {refusal_reason(failed)}")
            else:
                await self._retry(raw, sub.name, msg, failed)
            return
        heartbeat.cancel()
        await raw.ack()
        MESSAGES.labels(self.service, msg.type, "refused" if fresh else "duplicate").inc()

    async def _heartbeat(self, raws: list[Msg]) -> None:
        """Tell the server we are still working, so a slow batch is not redelivered mid-flight."""
        interval = max(self.settings.ack_wait_s / 3, 0.5)
        while True:
            await asyncio.sleep(interval)
            await asyncio.gather(*(raw.in_progress() for raw in raws))

    async def dead_letter(self, raw: Msg, consumer: str, reason: str, error: str) -> None:
        md = raw.metadata
        headers = {k: v for k, v in (raw.headers or {}).items() if not k.startswith("Nats-")}
        headers.update({
            "Nats-Msg-Id": f"dlq:{consumer}:{md.sequence.stream}",
            "Tessera-DLQ-Reason": reason,
            "Tessera-DLQ-Error": _header_safe(error),
            "Tessera-DLQ-Consumer": consumer,
            "Tessera-DLQ-Subject": raw.subject,
            "Tessera-DLQ-Stream": md.stream,
            "Tessera-DLQ-Stream-Seq": str(md.sequence.stream),
            "Tessera-DLQ-Deliveries": str(md.num_delivered),
        })
        js = self.broker.connection.jetstream()
        await js.publish(f"{DEAD_LETTER_PREFIX}.{self.service}.{consumer}", raw.data, headers=headers)
        await raw.ack()
        DEAD_LETTERS.labels(self.service, reason).inc()
        log.error("consumer.dead_lettered", consumer=consumer, reason=reason, error=error[:300],
                  stream_seq=md.sequence.stream)
