"""One consumer's handling of a fetched batch: an idempotent inbox, one transaction, bounded retries and a
dead-letter stream (``shared.consumer`` subscribes and fetches).

A batch is handled in one PostgreSQL transaction:

1. each message's envelope and payload are checked against the contract; a malformed message goes straight to
   the dead-letter stream (retrying cannot fix it); so does a forged one: what a node-agent sends (an event, or a
   command to another service such as ``scheduler.report_topology``) whose subject names a node (``{node_id}``)
   and whose payload names another (``forged``, below);
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

Forged events. The bus lets a node-agent publish only on its own node's subjects (``tooling.bus_permissions``),
so the node in the subject is the sender's. A message whose payload's ``node_id`` differs from it claims to speak
for another node: its handler never runs. It is dead-lettered with reason ``forged`` on
``deadletter.<service>.<consumer>.forged`` (headers ``Tessera-DLQ-Subject-Node`` and ``Tessera-DLQ-Payload-Node``),
logged at error level (``consumer.forged``) and counted (``tessera_dead_letters_total{reason="forged"}``): the
operators see it on the dead-letter page and, live, on the ops feed (``/v1/ops/events?subjects=deadletter.*.*.forged``).

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
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from opentelemetry import trace
from pydantic import ValidationError

from .contract import Message
from .envelope import Envelope
from .observability import DEAD_LETTERS, HANDLER_SECONDS, MESSAGES, extract_trace
from .outbox import Outbox
from .refusals import PermanentError, Refusal, permanent, refusal_reason
from .settings import BusSettings
from .streams import DEAD_LETTER_PREFIX
from .unit_of_work import RunUnderSavepoint, UnitOfWork, Writes

log = structlog.get_logger()
_TRACER = trace.get_tracer("tessera")   # resolves to the provider the runtime sets at start

Handler = Callable[[UnitOfWork, Any], Awaitable[None]]
# which of a batch's payloads the subscriber follows, read in one statement outside any transaction (the rest are
# acknowledged untouched: no transaction, no inbox row)
Interest = Callable[[asyncpg.Connection, list[Any]], Awaitable[list[bool]]]


def _header_safe(text: str, limit: int = 1000) -> str:
    """One printable ASCII line: NATS headers are not MIME, and some readers decode anything else oddly."""
    return "".join(c if " " <= c <= "~" else " " for c in text)[:limit]


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


class Batches:
    """How one durable consumer (``consumer``) handles what it fetches: ``msg`` checked, ``handler`` run,
    ``on_refused`` publishing what no retry can fix. ``lock``, when given, is held around each batch's
    transaction (``Consumers.exclusive``)."""

    def __init__(self, service: str, consumer: str, msg: Message, handler: Handler, on_refused: Refusal | None, *,
                 outbox: Outbox, settings: BusSettings, pool: Callable[[], asyncpg.Pool],
                 js: Callable[[], JetStreamContext], lock: asyncio.Lock | None = None,
                 step_key: Callable[[Any], str | None] | None = None, interest: Interest | None = None):
        """``step_key``: for a saga participant's commands, the idempotency key a message's handler locks
        (``shared.participant``): a batch of several locks and reads them all in one round trip first.
        ``interest``: for a subscriber that follows a few of the messages on its subject (the paas, the
        allocations that are its clusters' nodes), which of a batch it follows; the others are acknowledged
        without a transaction. It must read only what was committed before any message it follows was sent,
        so that what it ignores is what its handler would have found nothing to do for."""
        self.service, self.consumer, self.msg, self.handler, self.on_refused = service, consumer, msg, handler, on_refused
        self.outbox, self.settings, self._pool, self._js, self.lock = outbox, settings, pool, js, lock
        self.step_key, self.interest = step_key, interest
        # the subject token that names the sending node, for an event that also names it in its payload
        # (what a node-agent sends: its events, and its commands to others, e.g. scheduler.report_topology; the
        # commands *to* a node-agent come from the gateway and the saga, and the agent refuses another node's)
        tokens = msg.subject.split(".")
        self._node_token = tokens.index("{node_id}") if (
            (msg.kind == "event" or not msg.type.startswith("node_agent.")) and "{node_id}" in tokens
            and "node_id" in msg.model.model_fields) else None

    async def handle(self, raws: list[Msg]) -> None:
        """Handle one fetched batch (never raises: what fails is retried, refused or dead-lettered)."""
        try:
            items = [item for raw in raws if (item := await self._parse(raw)) is not None]
            if self.interest is not None and items:
                items = await self._followed(items)
            if not items:
                return
            heartbeat = asyncio.create_task(self._heartbeat([i.raw for i in items]))
            try:
                async with self.lock or contextlib.nullcontext():
                    await self._run_batch(items)
            except Exception as exc:   # the batch's own transaction failed (connection lost, commit refused)
                log.warning("consumer.batch_failed", consumer=self.consumer, messages=len(items), error=repr(exc))
                for item in items:
                    if not item.committed:
                        item.outcome = exc
            finally:
                heartbeat.cancel()
            await self._settle(items)
        except Exception as exc:   # noqa: BLE001 - never let a batch kill the pump; the server redelivers
            log.error("consumer.batch_crashed", consumer=self.consumer, error=repr(exc))

    async def _followed(self, items: list[_Item]) -> list[_Item]:
        """The items the subscriber follows (``interest``); the others are acknowledged at once. When the check
        fails, every item is handled as usual."""
        try:
            async with self._pool().acquire() as conn:
                follows = await self.interest(conn, [i.data for i in items])
        except Exception as exc:   # noqa: BLE001 - the handlers decide, as without a check
            log.warning("consumer.interest_failed", consumer=self.consumer, error=repr(exc))
            return items
        ignored = [i for i, f in zip(items, follows, strict=True) if not f]
        await asyncio.gather(*(i.raw.ack() for i in ignored))
        for _ in ignored:
            MESSAGES.labels(self.service, self.msg.type, "ignored").inc()
        return [i for i, f in zip(items, follows, strict=True) if f]

    async def _parse(self, raw: Msg) -> _Item | None:
        """The message's envelope and payload, checked against the contract; a malformed message is
        dead-lettered at once (retrying cannot fix it)."""
        try:
            env = Envelope.model_validate_json(raw.data)
            if env.type != self.msg.type:
                raise PermanentError(f"envelope type {env.type} on a {self.msg.type} subject")
            data = self.msg.model.model_validate(env.data)
        except (ValidationError, PermanentError, ValueError) as exc:
            await self.dead_letter(raw, "invalid", str(exc)[:2000])
            return None
        if self._node_token is not None and data.node_id is not None:
            subject_node, payload_node = raw.subject.split(".")[self._node_token], str(data.node_id)
            if subject_node.lower() != payload_node.lower():
                await self.forged(raw, env, subject_node, payload_node)
                return None
        return _Item(raw, env, data)

    async def forged(self, raw: Msg, env: Envelope, subject_node: str, payload_node: str) -> None:
        """An event on one node's subject whose payload names another: never handled, dead-lettered as forged."""
        log.error("consumer.forged", consumer=self.consumer, type=self.msg.type, subject=raw.subject,
                  subject_node=subject_node, payload_node=payload_node, event_id=str(env.id),
                  correlation_id=env.correlation_id)
        await self.dead_letter(raw, "forged", f"the subject names node {subject_node}, the payload node {payload_node}",
                               extra_headers={"Tessera-DLQ-Subject-Node": subject_node,
                                              "Tessera-DLQ-Payload-Node": payload_node}, suffix="forged")

    async def _run_batch(self, items: list[_Item]) -> None:
        """One transaction for the batch: one inbox insert for every message, each new message's handler,
        commit; then the after-commit callbacks of those that succeeded.

        The first attempt runs the handlers without savepoints (the usual batch, where every handler
        succeeds, pays for none). When a handler fails, that transaction is rolled back whole, and a batch
        of several is run again with each handler under a savepoint: a failing one rolls back only itself
        (its inbox row is removed), its neighbours' work commits. (A handler must therefore keep state
        outside the database to its after-commit callbacks, or be able to find it stale: it may run twice
        before anything commits.) In that first run the handlers may also leave work of one kind to be done
        once for them all just before the batch writes (``Writes.later``, e.g. the scheduler's claims); when it
        fails, the batch is run again the same way. A handler that raises ``RunUnderSavepoint`` in the first run
        (a saga step refused, whose own writes must be undone alone: ``UnitOfWork.optimistic``) has the batch run
        again that way even when it is alone in it."""
        try:
            await self._attempt(items, isolated=False)
        except _HandlerFailed as failed:
            if len(items) > 1 or isinstance(failed.__cause__, RunUnderSavepoint):
                await self._attempt(items, isolated=True)

    async def _attempt(self, items: list[_Item], *, isolated: bool) -> None:
        done: list[UnitOfWork] = []
        writes = Writes()   # the batch's outbox rows and step outcomes, written in one statement before its commit
        async with self._pool().acquire() as conn:
            async with conn.transaction():
                fresh = {r[0] for r in await conn.fetch(
                    "INSERT INTO inbox (consumer, event_id) SELECT $1, unnest($2::uuid[]) "
                    "ON CONFLICT DO NOTHING RETURNING event_id", self.consumer, [i.env.id for i in items])}
                await self._read_ahead(conn, writes, [i for i in items if i.env.id in fresh])
                writes.batched = not isolated and len(fresh) > 1
                failed = []
                for item in items:
                    item.outcome = None
                    if item.env.id not in fresh:
                        item.outcome = "duplicate"    # handled before (or earlier in this batch)
                        continue
                    fresh.discard(item.env.id)
                    uow = UnitOfWork(conn, self.outbox, name=self.consumer, causation=item.env, defer=True,
                                     writes=writes)
                    uow.optimistic = not isolated
                    try:
                        if isolated:
                            async with uow.conn.transaction():     # a savepoint that also drops what it kept
                                await self._call(item, uow)
                        else:
                            await self._call(item, uow)
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
                                       self.consumer, failed)
                try:
                    await writes.write(conn)   # the batch's outbox rows, outcomes and last statements: one statement
                except Exception as exc:
                    if not writes.batched:
                        raise
                    for item in items:          # the work left for later failed: each handler alone, again
                        if item.outcome == "ok":
                            item.outcome = exc
                    raise _HandlerFailed from exc
            for item in items:
                item.committed = True
        for uow in done:
            await uow.run_after_commit()

    async def _read_ahead(self, conn: asyncpg.Connection, writes: Writes, items: list[_Item]) -> None:
        """A participant's batch of several step commands: lock their keys and read their outcomes at once."""
        if self.step_key is not None and len(items) > 1:
            keys = sorted({key for item in items if (key := self.step_key(item.data))})
            if len(keys) > 1:
                await writes.read_ahead(conn, keys)

    async def _call(self, item: _Item, uow: UnitOfWork) -> None:
        """The handler, in the message's trace and log context."""
        env = item.env
        structlog.contextvars.bind_contextvars(correlation_id=env.correlation_id,
                                               tenant_id=str(env.tenant_id) if env.tenant_id else None)
        started = time.perf_counter()
        try:
            with _TRACER.start_as_current_span(f"{self.service} handle {self.msg.type}",
                                                context=extract_trace(item.raw.headers),
                                                kind=trace.SpanKind.CONSUMER) as span:
                if span.is_recording():
                    span.set_attribute("messaging.message.id", str(env.id))
                    span.set_attribute("tessera.correlation_id", env.correlation_id)
                await self.handler(uow, item.data)
        finally:
            HANDLER_SECONDS.labels(self.service, self.msg.type).observe(time.perf_counter() - started)
            structlog.contextvars.unbind_contextvars("correlation_id", "tenant_id")

    async def _settle(self, items: list[_Item]) -> None:
        """Ack what committed (and duplicates), then refuse or retry each failure on its own."""
        settled = [i for i in items if i.outcome in ("ok", "duplicate")]
        await asyncio.gather(*(i.raw.ack() for i in settled))
        for i in settled:
            MESSAGES.labels(self.service, self.msg.type, i.outcome).inc()
        for item in items:
            exc = item.outcome
            if not isinstance(exc, BaseException):
                continue
            if permanent(exc):
                await self._refuse(item, exc)
            else:
                await self._retry(item.raw, exc)

    async def _once(self, env: Envelope, work: Callable[[UnitOfWork], Awaitable[None]]) -> bool:
        """Run ``work`` in a new unit of work that records ``env`` in the consumer's inbox, then its after-commit
        hooks once committed; returns False, running nothing, when the inbox already holds ``env``."""
        async with self._pool().acquire() as conn, conn.transaction():
            fresh = await conn.fetchval(
                "INSERT INTO inbox (consumer, event_id) VALUES ($1, $2) ON CONFLICT DO NOTHING RETURNING 1",
                self.consumer, env.id)
            if fresh:
                uow = UnitOfWork(conn, self.outbox, name=self.consumer, causation=env, defer=True)
                await work(uow)
                await uow.flush()
        if fresh:
            await uow.run_after_commit()
        return bool(fresh)

    async def _retry(self, raw: Msg, exc: BaseException) -> None:
        """A failure a retry may fix: nak with backoff, or dead-letter once ``max_deliver`` deliveries failed."""
        delivered = raw.metadata.num_delivered
        MESSAGES.labels(self.service, self.msg.type, "error").inc()
        if delivered >= self.settings.max_deliver:
            log.error("consumer.gave_up", consumer=self.consumer, type=self.msg.type, deliveries=delivered,
                      error=repr(exc))
            await self.dead_letter(raw, "max_deliveries", repr(exc)[:2000])
        else:
            backoff = self.settings.retry_backoff_s
            delay = backoff[min(delivered - 1, len(backoff) - 1)]
            log.warning("consumer.retry", consumer=self.consumer, type=self.msg.type, deliveries=delivered,
                        delay_s=delay, error=repr(exc))
            await raw.nak(delay=delay)

    async def _refuse(self, item: _Item, exc: BaseException) -> None:
        """A failure no retry can fix (the handler's work rolled back): publish the refusal through
        ``on_refused`` in a new unit of work that records the inbox row, then ack; without a callback,
        dead-letter at once. A callback that fails is itself retried (a transient error) or dead-lettered."""
        raw, msg, on_refused = item.raw, self.msg, self.on_refused
        reason = refusal_reason(exc)
        log.warning("consumer.refused", consumer=self.consumer, type=msg.type, reason=reason[:300],
                    deliveries=raw.metadata.num_delivered, published=on_refused is not None)
        if on_refused is None:
            MESSAGES.labels(self.service, msg.type, "refused").inc()
            await self.dead_letter(raw, "rejected", reason)
            return
        heartbeat = asyncio.create_task(self._heartbeat([raw]))
        try:
            fresh = await self._once(item.env, lambda uow: on_refused(uow, item.data, reason))
        except Exception as failed:
            heartbeat.cancel()
            if permanent(failed):
                MESSAGES.labels(self.service, msg.type, "refused").inc()
                await self.dead_letter(raw, "rejected",
                                       f"{reason}; publishing the refusal failed too: {refusal_reason(failed)}")
            else:
                await self._retry(raw, failed)
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

    async def dead_letter(self, raw: Msg, reason: str, error: str, *, extra_headers: dict[str, str] | None = None,
                          suffix: str | None = None) -> None:
        """Move ``raw`` to the dead-letter stream, with why in its headers (and ``extra_headers``), and acknowledge
        it; its subject is ``deadletter.<service>.<consumer>``, then ``.<suffix>`` when given."""
        consumer, md = self.consumer, raw.metadata
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
            **(extra_headers or {}),
        })
        subject = f"{DEAD_LETTER_PREFIX}.{self.service}.{consumer}" + (f".{suffix}" if suffix else "")
        await self._js().publish(subject, raw.data, headers=headers)
        await raw.ack()
        DEAD_LETTERS.labels(self.service, reason).inc()
        log.error("consumer.dead_lettered", consumer=consumer, reason=reason, error=error[:300],
                  stream_seq=md.sequence.stream)
