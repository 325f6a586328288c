"""The process skeleton every service shares: connect, migrate, subscribe, relay, serve health.

A service's bootstrap builds a ``Runtime`` and passes a ``wire`` function that
registers its subscribers, HTTP routes and periodic work. Nothing connects
before ``Runtime.start()``.

Periodic work has one form, ``rt.every(seconds, step)``: on every replica, or
with ``leader=<service>`` on the one replica that leads (shared.periodic).
Subscribers registered ``leader_only`` do not start with the runtime: they
follow a leadership's hooks (``lead.on_gain(rt.consumers.start_leader_only)``,
``lead.on_lose(rt.consumers.stop_leader_only)``).
"""
from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import ssl
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg
import structlog
from aiohttp import web
from faststream.nats import NatsBroker
from faststream.nats.security import NatsNKey, NatsSecurity
from faststream.security import BaseSecurity
from nats.js import JetStreamContext

from . import rpc
from .bus_identity import identity, inbox_prefix, publish_scope
from .consumer import Consumers
from .contract import Catalog, load_catalog
from .db import create_pool, migrate
from .health import add_health_routes
from .observability import configure_logging, configure_tracing
from .outbox import Outbox, OutboxRelay
from .periodic import Leadership, Lease, lock_name, periodic
from .settings import ServiceSettings
from .streams import declare_streams, ensure_streams, own_streams

log = structlog.get_logger()


def nats_security(settings: ServiceSettings) -> BaseSecurity | None:
    """The bus connection's credentials (the nkey seed) and TLS (verifying the server against the CA file)."""
    tls = ssl.create_default_context(cafile=settings.nats_ca_file) if settings.nats_ca_file else None
    if settings.nats_nkey_file:
        return NatsNKey(settings.nats_nkey_file, ssl_context=tls, use_ssl=tls is not None)
    return NatsSecurity(ssl_context=tls, use_ssl=True) if tls else None



async def _cancel_all(tasks: list[asyncio.Task], grace_s: float = 10.0, every_s: float = 1.0) -> set[asyncio.Task]:
    """Cancel ``tasks`` and wait for them to end, cancelling again every ``every_s`` any that went on: a library
    call may swallow one cancellation (3.11's ``asyncio.wait_for`` does when its awaitable completes at the same
    moment). After ``grace_s`` the stragglers are logged and left (and returned), so a stop never hangs on one."""
    pending = {t for t in tasks if not t.done()}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace_s
    while pending and loop.time() < deadline:
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=min(every_s, max(deadline - loop.time(), 0)))
    for t in pending:
        log.error("service.task_did_not_stop", task=t.get_name(), coroutine=repr(t.get_coro()))
    return pending

class Runtime:
    def __init__(self, settings: ServiceSettings, *, schema: str | None = None, schema_dir: Path | None = None,
                 catalog: Catalog | None = None):
        self.settings = settings
        self.service = settings.service
        self.schema = schema or settings.service
        self.schema_dir = schema_dir
        self.catalog = catalog or load_catalog()
        self.outbox = Outbox(self.service, self.catalog)
        # its identity on the bus: the nkey seed in TESSERA_NATS_NKEY_FILE, inboxes of its own (shared.bus_identity)
        # and, with TESSERA_NATS_CA_FILE, TLS that verifies the server's certificate and host name
        # (a node-agent's identity is its node's: shared.bus_identity.identity)
        self.bus_identity = identity(self.service, settings.instance)
        self.broker = NatsBroker(settings.nats_servers, max_reconnect_attempts=-1, reconnect_time_wait=0.5,
                                 logger=None, security=nats_security(settings),
                                 inbox_prefix=inbox_prefix(self.bus_identity), error_cb=self._nats_error,
                                 reconnected_cb=self._nats_reconnected)
        self.consumers = Consumers(self.service, self.broker, self.catalog, self.outbox, settings.bus, lambda: self.pool)
        self.http = web.Application(client_max_size=1 << 20)
        self.tasks: list[Callable[[], Awaitable[None]]] = []
        self.on_stop: list[Callable[[], Awaitable[None]]] = []
        self.readiness: list[tuple[str, Callable[[], Awaitable[bool]]]] = []
        self.responders: list[tuple[str, Callable, dict[str, str]]] = []
        self.listeners: list[tuple[str, Callable]] = []
        self.leaderships: dict[str, Leadership] = {}
        self._answering: list = []
        self._pool: asyncpg.Pool | None = None
        self._running: list[asyncio.Task] = []
        self._runner: web.AppRunner | None = None
        self.relay: OutboxRelay | None = None
        self.port: int | None = None

    @property
    def pool(self) -> asyncpg.Pool:
        if self._pool is None:
            raise RuntimeError("runtime not started")
        return self._pool

    @property
    def js(self) -> JetStreamContext:
        return self.broker.connection.jetstream()

    @staticmethod
    async def _nats_error(exc: Exception) -> None:
        """What the server refused (an error: a permissions violation names the subject, and means the code does
        what its contract does not say) or a connection error (a warning: the client reconnects). Logged, never
        silent: nats-py hands the server's asynchronous -ERR only to this callback."""
        refused = "permissions violation" in str(exc).lower()
        (log.error if refused else log.warning)("nats.error", error=repr(exc))

    async def _nats_reconnected(self) -> None:
        """The connection is back: the consumers' open pull requests may be lost with the old one; ask again."""
        log.warning("nats.reconnected")
        self.consumers.renew_pulls()

    def answer(self, type_: str, handler: Callable, **params: str) -> None:
        """Answer the request ``type_`` (one this service owns, see shared.rpc) with ``handler`` once started."""
        self.responders.append((type_, handler, params))

    def background(self, work: Callable[[], Awaitable[None]]) -> None:
        """Run ``work`` once, at start, in the background (run again after an unexpected error). Periodic
        work is ``every``'s."""
        self.tasks.append(work)

    def every(self, seconds: float, step: Callable[[], Awaitable[object]], *, leader: str | None = None,
              at_once: bool = False) -> None:
        """Run ``step`` every ``seconds`` for the life of the process, first after one period (at once with
        ``at_once``). With ``leader``, only while this replica leads that leadership (``leader(...)``): one
        replica at a time runs it, another takes over when the leader dies or stops, and it runs at once on a
        replica that gains it. A step that raises is logged and the next one runs on time; a stop ends it."""
        self.tasks.append(periodic(seconds, step, leadership=self.leader(leader) if leader else None,
                                   at_once=at_once))

    def leader(self, name: str, *, elect: bool | None = None) -> Leadership:
        """The leadership ``name`` (this service's name, or ``<service>.<role>``: the lock is database-wide),
        made on first use and run with the runtime. ``elect=False`` (given on first use) turns election off:
        every replica leads."""
        if name != self.service and not name.startswith(f"{self.service}."):
            raise ValueError(f"leadership {name!r}: it must be named {self.service!r} or {self.service}.<role>")
        lead = self.leaderships.get(name)
        if lead is None:
            lease = Lease(self.settings.db_dsn, lock_name(name)) if elect is not False else None
            lead = self.leaderships[name] = Leadership(name, lease)
            self.tasks.append(lead.run)
        elif elect is not None and elect != (lead.lease is not None):
            raise ValueError(f"leadership {name!r}: election was turned {'on' if lead.lease else 'off'} already")
        return lead

    def listen(self, type_: str, callback: Callable[[object], Awaitable[None]]) -> None:
        """Hand every message of ``type_`` to ``callback`` in **this** process, once started: a plain core-NATS
        subscription to its subject, not a durable consumer, so every replica gets each one (what a per-process
        cache needs to drop itself). Nothing is acknowledged, retried or deduplicated: a listener must also
        refresh on its own now and then, in case a message passed while it was not connected. Like a consumer,
        it must be declared in the service's contract ``receives`` (its bus permissions come from there)."""
        self.catalog.check_receive(self.service, type_)
        self.listeners.append((type_, callback))

    async def _supervise(self, loop: Callable[[], Awaitable[None]]) -> None:
        while True:
            try:
                await loop()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.error("background.crashed", loop=getattr(loop, "__qualname__", str(loop)), error=repr(exc))
                await asyncio.sleep(1.0)

    async def start(self) -> None:
        s = self.settings
        configure_logging(self.service, s.log_level)
        self.tracer_provider = configure_tracing(self.service, s.trace_file)
        self._pool = await create_pool(s.db_dsn, self.schema)
        async with self._pool.acquire() as conn:
            applied = await migrate(conn, self.schema, self.schema_dir)
        await self.broker.connect()
        await declare_streams(self.js, replicas=s.stream_replicas, names=own_streams(self.service))
        await ensure_streams(self.js, self.consumers.streams - set(own_streams(self.service)), replicas=s.stream_replicas)
        await self.broker.start()
        # a node-agent's relay publishes its own node's rows of the shared outbox only
        self.relay = OutboxRelay(self._pool, self.js, self.schema, scope=publish_scope(self.service, s.instance))
        self.outbox.hand_over = self.relay.take
        self._running = [asyncio.create_task(self._supervise(self.relay.run))]
        await self.consumers.start()
        self._answering = [await rpc.serve(self.broker.connection, self.catalog, self.service, t, h, **p)
                           for t, h, p in self.responders]
        self._answering += [await self.broker.connection.subscribe(self.catalog.message(t).wildcard(), cb=cb)
                            for t, cb in self.listeners]
        self._running += [asyncio.create_task(self._supervise(t)) for t in self.tasks]
        self.readiness += [("database", self._db_ready), ("nats", self._nats_ready)]
        add_health_routes(self.http, self.readiness)
        self._runner = web.AppRunner(self.http, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, s.http_host, s.http_port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        log.info("service.started", http_port=self.port, migrations=applied, consumers=self.consumers.names)

    async def _db_ready(self) -> bool:
        async with self.pool.acquire(timeout=2) as conn:
            return await conn.fetchval("SELECT 1") == 1

    async def _nats_ready(self) -> bool:
        return self.broker.connection.is_connected

    async def stop(self) -> None:
        for sub in self._answering:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        await _cancel_all(self._running)
        with contextlib.suppress(Exception):
            await self.consumers.stop()
        if self.relay is not None:   # publish what the last batches committed, rather than leave it to a replica
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await self.relay.drain()
        for hook in self.on_stop:
            with contextlib.suppress(Exception):
                await hook()
        if self._runner:
            await self._runner.cleanup()
        with contextlib.suppress(Exception):
            await self.broker.stop()
        if self._pool:
            await self._pool.close()
        with contextlib.suppress(Exception):
            self.tracer_provider.shutdown()
        log.info("service.stopped")

    async def run_forever(self) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        me = os.getpid()

        # Not loop.add_signal_handler: it routes signals through a wakeup socket that a forked child (pyroute2
        # enters network namespaces in forked children) inherits, so a SIGTERM meant for such a child would
        # stop this service. A plain handler runs in the process the signal was sent to; a child ignores it.
        def stopping(signum: int, _frame) -> None:
            if os.getpid() != me:
                os._exit(0)   # a forked child of this service that was told to stop
            log.info("service.stopping", signal=signal.Signals(signum).name)
            loop.call_soon_threadsafe(stop.set)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, stopping)
        await self.start()
        settle_heap()
        if self.port is not None:
            # The runner and the tests read this line to learn the health port.
            print(f"TESSERA_READY service={self.service} instance={self.settings.instance} port={self.port}", flush=True)
        await stop.wait()
        await self.stop()


def settle_heap() -> None:
    """Once a service has started: collect what the start left behind, then move every object alive to the
    collector's permanent generation (``gc.freeze``). A service's heap is mostly what it made to start (modules,
    contracts, schemas, policies); left in the oldest generation, every full collection walked all of it, a pause
    of 100–400 ms of the whole process a few times a minute under load, in the middle of whatever it was handling
    (measured under bench:noisy's flood). Frozen, a full collection walks only what was made since."""
    gc.collect()
    gc.freeze()


def serve(build: Callable[[], Runtime], service: str) -> None:
    """A service process's entry point: a bad setting ends it with one line naming the variable
    (exit status 1), not a traceback; otherwise it runs until SIGTERM/SIGINT."""
    try:
        runtime = build()
    except ValueError as exc:   # every settings error is a ValueError naming its variable
        sys.exit(f"{service}: cannot start: {exc}")
    asyncio.run(runtime.run_forever())
