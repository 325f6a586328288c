"""Durable JetStream pull consumers, checked against the contracts: registration, start and stop (also as a
replica gains and loses leadership), and the fetch loop that hands each batch to ``shared.batches``, which
handles it in one transaction with an idempotent inbox, bounded retries and a dead-letter stream.

A consumer keeps one pull request open on the server for as many messages as its window (a few batches' worth)
has room for (``shared.pull``), and puts each message into the window as it arrives; it runs
``max_workers`` batches at once, each built from the window fairly between the tenants whose messages wait in
it (``shared.fairness``: weighted deficit round robin, by the ``Tessera-Tenant`` header), so one tenant's burst
does not queue ahead of another tenant's next message. A message waits in the window under the server's
in-progress signal (never redelivered while it waits); on stop, what still waits there is given back to the
server (nak), which delivers it again at once, here or to another replica.
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import asyncpg
import structlog
from faststream.nats import NatsBroker
from nats.aio.msg import Msg
from nats.js.api import AckPolicy as JsAckPolicy
from nats.js.api import ConsumerConfig
from nats.js.errors import NotFoundError

from .batches import Batches, Handler, Interest
from .contract import Catalog, ContractViolation, Message, durable_name
from .fairness import FairQueue, line_of
from .observability import CONSUMER_PENDING
from .outbox import Outbox
from .pull import StandingPull
from .refusals import Refusal
from .settings import BusSettings
from .steps import Step

log = structlog.get_logger()
MAX_ACK_PENDING = 1000   # per consumer: the window and the batches in flight stay well below it
WINDOW_MIN, WINDOW_MAX = 64, 512


class _Window:
    """Messages fetched and not yet handed to a worker, one line per tenant; ``room`` is set while it may take
    more, ``ready`` while something waits."""

    def __init__(self, size: int):
        self.size = size
        self._queue: FairQueue[Msg] = FairQueue()
        self.room, self.ready = asyncio.Event(), asyncio.Event()
        self.room.set()

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def free(self) -> int:
        return self.size - len(self._queue)

    def put(self, raws: list[Msg]) -> None:
        for raw in raws:
            line, weight = line_of(raw.headers)
            self._queue.put(line, raw, weight)
        self._signal()

    def take(self, n: int) -> list[Msg]:
        """Up to ``n`` messages, fairly between the tenants waiting, grouped by tenant in one order (batches
        handled at once then take each tenant's row locks in that order)."""
        taken = self._queue.take_batch(n)
        self._signal()
        return taken

    def waiting(self) -> list[Msg]:
        return list(self._queue)

    def drain(self) -> list[Msg]:
        taken = self._queue.drain()
        self._signal()
        return taken

    def _signal(self) -> None:
        for event, on in ((self.room, self.free > 0), (self.ready, len(self._queue) > 0)):
            if on:
                event.set()
            else:
                event.clear()


class _Subscription:
    """One durable pull consumer: where it reads, how much at once, what handles a batch (``batches``), and
    (while it runs) its fetch loop."""

    def __init__(self, name: str, subject: str, stream: str, batches: Batches, *, batch: int, workers: int):
        self.name, self.subject, self.stream, self.batches = name, subject, stream, batches
        self.batch, self.workers = batch, workers
        # a few batches beyond those in flight: enough to see other tenants behind a burst, few enough that a
        # replica does not hold back from its peers more than it will soon handle
        self.window = _Window(max(batch, min(max(2 * batch * workers, WINDOW_MIN), WINDOW_MAX,
                                             MAX_ACK_PENDING - batch * workers)))
        self.pull: StandingPull | None = None       # its open pull request while running
        self.pump: asyncio.Task | None = None
        self.inflight: set[asyncio.Task] = set()


def _key_of(msg: Message, field: str) -> Callable[[Any], str | None] | None:
    """The key a participant's handler of ``msg`` locks (shared.participant), which a batch of several locks and
    reads at once: its ``field``; None for a notice, whose payload has no key (nothing to lock ahead)."""
    if field not in msg.model.model_fields:
        return None
    return lambda cmd: getattr(cmd, field)


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
                  leader_only: bool = False, on_refused: Refusal | None = None, exclusive: bool = False,
                  step_key: Callable[[Any], str | None] | None = None, interest: Interest | None = None) -> str:
        """Consume ``type_`` with ``handler``. ``on_refused(ctx, data, reason)`` publishes the service's refusal
        when the handler fails for a reason no retry can fix (``permanent``): it runs in a new unit of work
        (the handler's rolled back) that also records the inbox row, then the message is acknowledged.
        Without it such a message is dead-lettered at once.

        ``batch_size`` messages at most are handled in one transaction (1 for a handler that does slow
        work outside the database, e.g. a driver call), ``max_workers`` such transactions at once. ``interest``
        (``Batches``): which messages of a batch the handler follows, the others acknowledged without a
        transaction."""
        msg = self.catalog.check_receive(self.service, type_)
        subject = msg.render_subject(**subject_params) if subject_params else msg.wildcard()
        name = durable or durable_name(self.service, type_)
        batches = Batches(self.service, name, msg, handler, on_refused, outbox=self.outbox, settings=self.settings,
                          pool=self._pool, js=lambda: self.broker.connection.jetstream(),
                          lock=self.exclusive if exclusive else None, step_key=step_key, interest=interest)
        sub = _Subscription(name, subject, self.catalog.owner(type_).stream, batches,
                            batch=batch_size or self.settings.batch_size,
                            workers=max_workers or self.settings.max_workers)
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
                               leader_only=leader_only, exclusive=exclusive, step_key=_key_of(msg, field))
                for msg, handler, field in ((step.command, invoke, "idempotency_key"), (step.undo, undo, "compensates"))
                if msg is not None]

    @property
    def streams(self) -> set[str]:
        """The streams the registered subscribers read."""
        return {sub.stream for sub in (*self._always, *self._leader_only)}

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

    def renew_pulls(self) -> None:
        """The connection came back: every running subscriber asks again at once (its open request may be lost)."""
        for sub in self._running:
            if sub.pull is not None:
                sub.pull.renew()

    def _consumer_config(self) -> ConsumerConfig:
        """A new one each time: nats-py fills in names on the one it is given."""
        return ConsumerConfig(
            ack_policy=JsAckPolicy.EXPLICIT, ack_wait=self.settings.ack_wait_s,
            max_deliver=self.settings.max_deliver + 1,  # the server's own cap sits above ours; we dead-letter
            max_ack_pending=MAX_ACK_PENDING)

    async def _start_all(self, subs: list[_Subscription]) -> None:
        try:
            for sub in subs:
                await self._follow_contract(sub)
                sub.pull = await StandingPull(self.broker.connection, sub.stream, sub.name,
                                              expires_s=self.settings.pull_expires_s).start()
                sub.pump = asyncio.create_task(self._pump(sub), name=f"consume {sub.name}")
                self._running.append(sub)
        except BaseException:
            for sub in subs:      # all or none: a later call starts them all again
                if sub in self._running:
                    self._running.remove(sub)
                    await self._stop(sub)
            raise

    async def _follow_contract(self, sub: _Subscription) -> None:
        """The durable, created on the contract's subject when it does not exist. One that exists with another
        filter (the contract moved the message, e.g. onto its node's subject) is brought to the contract's: the
        server updates a durable's filter in place (NATS 2.10+), keeping its position; the bus permissions allow
        exactly the create of the new filter."""
        js = self.broker.connection.jetstream()
        try:
            info = await js.consumer_info(sub.stream, sub.name)
        except NotFoundError:
            config = self._consumer_config()
            config.name = config.durable_name = sub.name
            config.filter_subject = sub.subject
            await js.add_consumer(sub.stream, config)
            return
        if info.config.filter_subject == sub.subject or info.config.filter_subjects:
            return
        config = self._consumer_config()
        config.durable_name, config.filter_subject = sub.name, sub.subject
        await js.add_consumer(sub.stream, config)
        log.warning("consumer.filter_updated", consumer=sub.name, was=info.config.filter_subject, now=sub.subject)

    async def _stop(self, sub: _Subscription) -> None:
        """Stop fetching, give back what waits in the window, let the batches in flight finish.

        The pull subscription goes first: a long poll still open on the server would otherwise take one of the
        messages given back, and it would come again only after ``ack_wait``. The batches in flight ack on the
        connection, not the subscription."""
        if sub.pump is not None:
            sub.pump.cancel()
            with contextlib.suppress(BaseException):
                await sub.pump
        if sub.pull is not None:
            with contextlib.suppress(Exception):
                await sub.pull.stop()
        waiting = sub.window.drain()
        if waiting:   # not handled here: the server delivers them again at once, here or to another replica
            with contextlib.suppress(Exception):
                await asyncio.gather(*(raw.nak() for raw in waiting))
                await self.broker.connection.flush()
        if sub.inflight:
            await asyncio.wait(list(sub.inflight), timeout=self.settings.ack_wait_s)
        sub.pump, sub.pull = None, None

    async def _pump(self, sub: _Subscription) -> None:
        """Fetch into the subscription's window while it has room, and hand batches from it to free workers."""
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._fill(sub))
            tasks.create_task(self._dispatch(sub))
            tasks.create_task(self._keep_waiting(sub))

    async def _fill(self, sub: _Subscription) -> None:
        """Fetch what is there (a long poll of ``fetch_wait_s`` when nothing is) while the window has room. A
        message arriving during the poll is delivered at once; the poll's length only sets how often an idle
        consumer asks."""
        window = sub.window
        while True:
            await window.room.wait()
            try:
                fetched = await self._fetch(sub, window.free)
            except TimeoutError:   # nothing arrived (nats-py raises its own subclass, or asyncio's)
                continue
            except Exception as exc:   # reconnecting, server unavailable: the messages stay on the server
                log.warning("consumer.fetch_failed", consumer=sub.name, error=repr(exc))
                await asyncio.sleep(0.5)
                continue
            window.put(fetched)

    async def _dispatch(self, sub: _Subscription) -> None:
        """Whenever a worker is free and messages wait, hand it a batch the window picks fairly between tenants."""
        free, window = asyncio.Semaphore(sub.workers), sub.window
        while True:
            await free.acquire()
            await window.ready.wait()
            batch = window.take(sub.batch)
            task = asyncio.create_task(sub.batches.handle(batch))
            sub.inflight.add(task)
            task.add_done_callback(lambda t: (sub.inflight.discard(t), free.release()))

    async def _keep_waiting(self, sub: _Subscription) -> None:
        """Tell the server every third of ``ack_wait`` that the messages waiting in the window are being worked
        on, so none is redelivered while it waits its turn (once handed to a worker, ``Batches`` does the same:
        at most two thirds of ``ack_wait`` pass without a word)."""
        interval = max(self.settings.ack_wait_s / 3, 0.5)
        while True:
            await asyncio.sleep(interval)
            waiting = sub.window.waiting()
            if waiting:
                with contextlib.suppress(Exception):   # reconnecting: they are redelivered, the inbox dedups
                    await asyncio.gather(*(raw.in_progress() for raw in waiting))

    async def _fetch(self, sub: _Subscription, room: int) -> list[Msg]:
        """What the subscription's open pull request delivered (``shared.pull``): the first message to arrive,
        waiting for it at most ``fetch_wait_s``, and every other one already there, within ``room``."""
        lag = CONSUMER_PENDING.labels(self.service, sub.name)   # the stream's backlog plus the window's
        try:
            got = await sub.pull.next_batch(room, timeout=self.settings.fetch_wait_s)
        except TimeoutError:
            lag.set(len(sub.window))   # nothing more was there for the whole poll
            raise
        lag.set((got[-1].metadata.num_pending or 0) + len(sub.window) + len(got))
        return got
