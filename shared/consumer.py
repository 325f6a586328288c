"""Durable JetStream consumers with an idempotent inbox, bounded retries and a dead-letter stream.

For each message: validate the envelope and payload against the contract (a
malformed message goes straight to the dead-letter stream: retrying cannot fix
it); then, in one PostgreSQL transaction, record (consumer, event id) in the
inbox and run the handler, whose writes and outbox messages commit with it. A
redelivered message finds its inbox row and has no second effect. A handler
error is retried with backoff (nak with delay) up to ``max_deliver`` deliveries,
then the message is moved to the dead-letter stream and acknowledged, so the
messages behind it keep flowing.

An error no retry can fix (``permanent``: PermanentError, invalid data, an unknown
reference) is not retried: the handler's transaction rolls back and, when the
subscription declares ``on_refused``, that callback publishes the refusal in a new
transaction that also records the inbox row (a redelivery has no second effect);
without one the message is dead-lettered at once.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import asyncpg
import structlog
from faststream.middlewares import AckPolicy
from faststream.nats import JStream, NatsBroker, NatsMessage, PullSub
from nats.js.api import AckPolicy as JsAckPolicy
from nats.js.api import ConsumerConfig
from opentelemetry import trace
from pydantic import ValidationError

from .settings import BusSettings
from .contract import Catalog, ContractViolation, Message
from .envelope import Envelope
from .observability import DEAD_LETTERS, HANDLER_SECONDS, MESSAGES, extract_trace, tracer
from .outbox import Outbox
from .steps import Step
from .streams import DEAD_LETTER_PREFIX
from .unit_of_work import UnitOfWork

log = structlog.get_logger()


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


class Consumers:
    """Registers contract-checked durable pull subscribers on a FastStream broker.

    A ``leader_only`` subscriber is not started with the broker: ``start_leader_only`` creates and starts
    it (a FastStream dynamic subscriber, ``persistent=False``) once the broker runs, ``stop_leader_only``
    stops and forgets it; a replica calls them as it gains and loses leadership, as often as it does.
    """

    def __init__(self, service: str, broker: NatsBroker, catalog: Catalog, outbox: Outbox,
                 settings: BusSettings, pool_getter: Callable[[], asyncpg.Pool]):
        self.service, self.broker, self.catalog, self.outbox = service, broker, catalog, outbox
        self.settings = settings
        self._pool = pool_getter
        self.names: list[str] = []
        self._leader_only: list[Callable[[], Any]] = []     # each registers one subscriber (not persistent)
        self._leading: list[Any] = []                      # the leader-only subscribers running now

    def subscribe(self, type_: str, handler: Handler, *, subject_params: dict[str, str] | None = None,
                  durable: str | None = None, max_workers: int | None = None, leader_only: bool = False,
                  on_refused: Refusal | None = None) -> str:
        """Consume ``type_`` with ``handler``. ``on_refused(ctx, data, reason)`` publishes the service's refusal
        when the handler fails for a reason no retry can fix (``permanent``): it runs in a new unit of work
        (the handler's rolled back) that also records the inbox row, then the message is acknowledged.
        Without it such a message is dead-lettered at once."""
        msg = self.catalog.check_receive(self.service, type_)
        subject = msg.render_subject(**subject_params) if subject_params else msg.wildcard()
        owner = self.catalog.owner(type_)
        name = durable or f"{self.service}__{type_.replace('.', '_')}"
        config = ConsumerConfig(
            ack_policy=JsAckPolicy.EXPLICIT, ack_wait=self.settings.ack_wait_s,
            max_deliver=self.settings.max_deliver + 1,  # the server's own cap sits above ours; we dead-letter
            max_ack_pending=1000,
        )
        workers = max_workers or self.settings.max_workers
        run = self._wrap(name, msg, handler, on_refused)
        broker_context = self.broker.context

        async def _entry(_body) -> None:
            # The message comes from FastStream's context, not an annotated parameter: resolving a
            # NatsMessage annotation runs fast_depends' Context.use in a thread pool for every message.
            await run(broker_context.get_local("message"))

        def register(persistent: bool = True):
            subscriber = self.broker.subscriber(
                subject, stream=JStream(name=owner.stream, declare=False), durable=name, config=config,
                pull_sub=PullSub(batch_size=min(64, max(workers, 1)), timeout=1.0), ack_policy=AckPolicy.MANUAL,
                max_workers=workers, title=f"{name}:{subject}", description=msg.summary, persistent=persistent,
            )
            subscriber(_entry)
            return subscriber

        if leader_only:
            self._leader_only.append(partial(register, persistent=False))
        else:
            register()
        self.names.append(name)
        return name

    def participate(self, step: Step, *, invoke: Handler, undo: Handler | None = None,
                    subject_params: dict[str, str] | None = None, durable: str | None = None,
                    max_workers: int | None = None, leader_only: bool = False) -> list[str]:
        """Subscribe a participant to a declared saga step: ``invoke`` handles its command, ``undo`` its undo
        command (given exactly when the step has one). ``durable``, if given, prefixes the consumer names
        (``<durable>__<command name>``)."""
        if (undo is None) != (step.undo is None):
            raise ContractViolation(f"{step.command.type}: an undo handler goes with an undo command, and only then")
        return [self.subscribe(msg.type, handler, subject_params=subject_params, max_workers=max_workers,
                               durable=durable and f"{durable}__{msg.name}", leader_only=leader_only)
                for msg, handler in ((step.command, invoke), (step.undo, undo)) if msg is not None]

    async def start_leader_only(self) -> None:
        """Create and start the leader-only subscribers (the broker must be running)."""
        if self._leading:
            return
        try:
            for register in self._leader_only:
                subscriber = register()
                self._leading.append(subscriber)
                await subscriber.start()
        except BaseException:
            await self.stop_leader_only()     # all or none: a later call starts them all again
            raise

    async def stop_leader_only(self) -> None:
        """Stop the leader-only subscribers (messages in flight finish first) and forget them."""
        running, self._leading = self._leading, []
        for subscriber in running:
            with contextlib.suppress(Exception):
                await subscriber.stop()

    def _wrap(self, consumer: str, msg: Message, handler: Handler, on_refused: Refusal | None = None):
        async def run(nmsg: NatsMessage) -> None:
            raw = nmsg.raw_message
            try:
                env = Envelope.model_validate_json(nmsg.body)
                if env.type != msg.type:
                    raise PermanentError(f"envelope type {env.type} on a {msg.type} subject")
                data = msg.model.model_validate(env.data)
            except (ValidationError, PermanentError, ValueError) as exc:
                await self.dead_letter(nmsg, consumer, "invalid", str(exc)[:2000])
                return
            ctx_token = extract_trace(raw.headers)
            structlog.contextvars.bind_contextvars(correlation_id=env.correlation_id,
                                                   tenant_id=str(env.tenant_id) if env.tenant_id else None)
            started = time.perf_counter()
            heartbeat = asyncio.create_task(self._heartbeat(nmsg))
            try:
                with tracer().start_as_current_span(f"{self.service} handle {msg.type}", context=ctx_token,
                                                    kind=trace.SpanKind.CONSUMER) as span:
                    span.set_attribute("messaging.message.id", str(env.id))
                    span.set_attribute("tessera.correlation_id", env.correlation_id)
                    fresh = await self._once(consumer, env, lambda uow: handler(uow, data))
                heartbeat.cancel()
                await nmsg.ack()
                MESSAGES.labels(self.service, msg.type, "ok" if fresh else "duplicate").inc()
            except Exception as exc:
                if permanent(exc):
                    await self._refuse(nmsg, consumer, msg, env, data, exc, on_refused, heartbeat)
                else:
                    heartbeat.cancel()
                    await self._retry(nmsg, consumer, msg, exc)
            finally:
                heartbeat.cancel()
                HANDLER_SECONDS.labels(self.service, msg.type).observe(time.perf_counter() - started)
                structlog.contextvars.unbind_contextvars("correlation_id", "tenant_id")

        return run

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

    async def _retry(self, nmsg: NatsMessage, consumer: str, msg: Message, exc: BaseException) -> None:
        """A failure a retry may fix: nak with backoff, or dead-letter once ``max_deliver`` deliveries failed."""
        delivered = nmsg.raw_message.metadata.num_delivered
        MESSAGES.labels(self.service, msg.type, "error").inc()
        if delivered >= self.settings.max_deliver:
            log.error("consumer.gave_up", consumer=consumer, type=msg.type, deliveries=delivered, error=repr(exc))
            await self.dead_letter(nmsg, consumer, "max_deliveries", repr(exc)[:2000])
        else:
            backoff = self.settings.retry_backoff_s
            delay = backoff[min(delivered - 1, len(backoff) - 1)]
            log.warning("consumer.retry", consumer=consumer, type=msg.type, deliveries=delivered,
                        delay_s=delay, error=repr(exc))
            await nmsg.nack(delay=delay)

    async def _refuse(self, nmsg: NatsMessage, consumer: str, msg: Message, env: Envelope, data: Any,
                      exc: BaseException, on_refused: Refusal | None, heartbeat: asyncio.Task) -> None:
        """A failure no retry can fix (the handler's transaction rolled back): publish the refusal through
        ``on_refused`` in a new unit of work that records the inbox row, then ack; without a callback,
        dead-letter at once. A callback that fails is itself retried (a transient error) or dead-lettered."""
        reason = refusal_reason(exc)
        log.warning("consumer.refused", consumer=consumer, type=msg.type, reason=reason[:300],
                    deliveries=nmsg.raw_message.metadata.num_delivered, published=on_refused is not None)
        if on_refused is None:
            heartbeat.cancel()
            MESSAGES.labels(self.service, msg.type, "refused").inc()
            await self.dead_letter(nmsg, consumer, "rejected", reason)
            return
        try:
            fresh = await self._once(consumer, env, lambda uow: on_refused(uow, data, reason))
        except Exception as failed:
            heartbeat.cancel()
            if permanent(failed):
                MESSAGES.labels(self.service, msg.type, "refused").inc()
                await self.dead_letter(nmsg, consumer, "rejected",
                                       f"{reason}; publishing the refusal failed too: {refusal_reason(failed)}")
            else:
                await self._retry(nmsg, consumer, msg, failed)
            return
        heartbeat.cancel()
        await nmsg.ack()
        MESSAGES.labels(self.service, msg.type, "refused" if fresh else "duplicate").inc()

    async def _heartbeat(self, nmsg: NatsMessage) -> None:
        """Tell the server we are still working, so a slow step is not redelivered mid-flight."""
        interval = max(self.settings.ack_wait_s / 3, 0.5)
        while True:
            await asyncio.sleep(interval)
            await nmsg.in_progress()

    async def dead_letter(self, nmsg: NatsMessage, consumer: str, reason: str, error: str) -> None:
        raw = nmsg.raw_message
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
        await js.publish(f"{DEAD_LETTER_PREFIX}.{self.service}.{consumer}", nmsg.body, headers=headers)
        await nmsg.ack()
        DEAD_LETTERS.labels(self.service, reason).inc()
        log.error("consumer.dead_lettered", consumer=consumer, reason=reason, error=error[:300],
                  stream_seq=md.sequence.stream)
