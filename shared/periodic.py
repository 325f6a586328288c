"""Periodic work, on every replica or on one: ``Runtime.every`` runs a step every so many seconds, and
``Runtime.leader`` elects the one replica of a service that runs the steps only one should.

A leader holds a PostgreSQL session advisory lock (``pg_advisory_lock``) on a connection of its own for as
long as it leads, like kube-scheduler's lease without a clock: PostgreSQL releases the lock the moment that
session ends (process killed, connection cut, clean stop), and a standby's next ``pg_try_advisory_lock``
succeeds. No lease duration to tune, no clock skew. A leader whose session fails learns it on its next probe
and stops leading at once; it then stands back a few probes, so that a healthy standby takes over first.

Leadership is not a fence: a leader cut off from PostgreSQL may finish the step it is in while a standby
already leads. A leader-only step spares the other replicas the work and the contention; what it writes
must still be correct should two run at once (row locks, idempotent statements).
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial

import asyncpg
import structlog

log = structlog.get_logger()

Step = Callable[[], Awaitable[object]]
Hook = Callable[[], Awaitable[object]]


def step_name(step: Callable) -> str:
    """What the logs call a step: its function's qualified name (through ``functools.partial``)."""
    while isinstance(step, partial):
        step = step.func
    return getattr(step, "__qualname__", repr(step))


def lock_name(leader: str) -> str:
    """The advisory lock a leadership holds (database-wide: each leadership's name is its service's)."""
    return f"tessera.{leader}.leader"


class Lease:
    """The advisory lock ``name`` on a dedicated connection to ``dsn``, probed every ``probe_s``."""

    def __init__(self, dsn: str, name: str, *, probe_s: float = 0.5):
        self.dsn, self.name, self.probe_s = dsn, name, probe_s
        self._conn: asyncpg.Connection | None = None

    async def acquire(self) -> None:
        """Block until this process holds the lock (retrying while PostgreSQL is unreachable)."""
        while True:
            try:
                if self._conn is None or self._conn.is_closed():
                    self._conn = await asyncpg.connect(self.dsn, server_settings={"application_name": self.name})
                if await self._conn.fetchval("SELECT pg_try_advisory_lock(hashtextextended($1, 0))", self.name):
                    log.info("leader.elected", lock=self.name)
                    return
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                log.warning("leader.probe_failed", lock=self.name, error=repr(exc))
                await self.release()
            await asyncio.sleep(self.probe_s)

    async def watch(self) -> None:
        """Return when the lock is lost (its session is gone). Never returns while it holds."""
        while True:
            await asyncio.sleep(self.probe_s)
            try:
                # asyncio.timeout, not wait_for: 3.11's wait_for drops a cancellation that arrives as the probe
                # answers, and a stop would then wait for a watch that never ends
                async with asyncio.timeout(max(self.probe_s * 4, 2.0)):
                    await self._conn.fetchval("SELECT 1")
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError, AttributeError) as exc:
                log.error("leader.lost", lock=self.name, error=repr(exc))
                return

    async def release(self) -> None:
        """Give up the lock (closing the session releases it)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                async with asyncio.timeout(2):
                    await conn.close()
            except Exception:   # noqa: BLE001 -- a session that will not close politely is cut below
                pass
            finally:            # even when a stop cancels the close: the lock must not outlive the leader
                if not conn.is_closed():
                    conn.terminate()

    def terminate_for_test(self) -> None:
        """Cut the session without a goodbye, as a crashed process would."""
        if self._conn is not None:
            self._conn.terminate()


class Leadership:
    """One replica at a time leads (holds ``lease``); without a lease every replica leads (election off).

    ``leading`` is set while this replica leads. Hooks given to ``on_gain`` run, in order, before it is set;
    those given to ``on_lose`` run, in the reverse order, after it is cleared: on losing the lock, and at
    shutdown. A gain hook that raises ends the term (the lose hooks run, the lock is released) and the runtime
    starts ``run`` again."""

    def __init__(self, name: str, lease: Lease | None):
        self.name, self.lease = name, lease
        self.leading = asyncio.Event()
        self._gain: list[Hook] = []
        self._lose: list[Hook] = []

    def on_gain(self, hook: Hook) -> None:
        self._gain.append(hook)

    def on_lose(self, hook: Hook) -> None:
        self._lose.append(hook)

    async def run(self) -> None:
        """Lead whenever this replica holds the lock, for the life of the process."""
        try:
            while True:
                if self.lease is not None:
                    await self.lease.acquire()
                try:
                    for hook in self._gain:
                        await hook()
                    self.leading.set()
                    log.info("leader.leading", leader=self.name)
                    await (self.lease.watch() if self.lease is not None else asyncio.Event().wait())
                finally:
                    await to_the_end(self._step_down())
                if self.lease is not None:   # let a healthy standby take over first
                    await asyncio.sleep(self.lease.probe_s * 4)
        finally:
            if self.lease is not None:
                await self.lease.release()

    async def _step_down(self) -> None:
        was = self.leading.is_set()
        self.leading.clear()
        for hook in reversed(self._lose):
            try:
                await hook()
            except Exception as exc:   # noqa: BLE001 -- the other hooks and the release still run
                log.error("leader.lose_hook_failed", leader=self.name, hook=step_name(hook), error=repr(exc))
        if self.lease is not None:
            await self.lease.release()
        if was:
            log.info("leader.stood_down", leader=self.name)


async def to_the_end(work: Awaitable[object]) -> None:
    """Await ``work`` to its end even when this task is cancelled again meanwhile, then let the cancellation
    through. A stop cancels again, every second, a task that goes on (``shared.runtime._cancel_all``); a
    step-down cut short there would leave a leader-only subscriber half stopped (its batches in flight are
    waited for) and skip the lose hooks after it. A step-down that never ends is the stop's straggler."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True
    task.result()
    if cancelled:
        raise asyncio.CancelledError


def periodic(seconds: float, step: Step, *, leadership: Leadership | None = None,
             at_once: bool = False) -> Callable[[], Awaitable[None]]:
    """The loop ``Runtime.every`` runs: ``step`` every ``seconds`` (first at once with ``at_once``, otherwise
    after one period), only while ``leadership`` leads when one is given (a replica that gains it runs the
    step at once). A step that raises is logged and the next one runs on time; a stop cancels the loop."""
    name = step_name(step)

    async def loop() -> None:
        if not at_once:
            await asyncio.sleep(seconds)
        while True:
            if leadership is not None:
                await leadership.leading.wait()
            try:
                await step()
            except Exception as exc:   # noqa: BLE001 -- the next round tries again
                log.error("periodic.failed", step=name, leader=leadership and leadership.name, error=repr(exc))
            task = asyncio.current_task()
            if task is not None and task.cancelling():   # a stop that a library call swallowed (3.11's wait_for)
                raise asyncio.CancelledError
            await asyncio.sleep(seconds)
    loop.__qualname__ = f"every({seconds:g}s, {name}{', leader=' + leadership.name if leadership else ''})"
    return loop
