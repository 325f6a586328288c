"""Leader election with a PostgreSQL session advisory lock (like kube-scheduler's lease, without a clock).

The leader holds ``pg_advisory_lock`` on a dedicated connection for as long as it leads. PostgreSQL
releases the lock the moment that session ends (process killed, connection cut), and a standby's
``pg_try_advisory_lock`` then succeeds: no lease duration to tune, no clock skew. A leader that loses its
connection learns it on its next probe and must stop deciding at once (``watch`` returns).
"""
from __future__ import annotations

import asyncio
import contextlib

import asyncpg
import structlog

log = structlog.get_logger()

LOCK_NAME = "tessera.scheduler.leader"


class LeaderLease:
    def __init__(self, dsn: str, *, name: str = LOCK_NAME, probe_s: float = 0.5):
        self.dsn, self.name, self.probe_s = dsn, name, probe_s
        self._conn: asyncpg.Connection | None = None

    async def acquire(self) -> None:
        """Block until this process holds the lock (retrying while PostgreSQL is unreachable)."""
        while True:
            try:
                if self._conn is None or self._conn.is_closed():
                    self._conn = await asyncpg.connect(self.dsn, server_settings={"application_name": self.name})
                if await self._conn.fetchval("SELECT pg_try_advisory_lock(hashtextextended($1, 0))", self.name):
                    log.info("scheduler.leader_elected")
                    return
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                log.warning("scheduler.leader_probe_failed", error=repr(exc))
                await self.release()
            await asyncio.sleep(self.probe_s)

    async def watch(self) -> None:
        """Return when leadership is lost (the lock's session is gone). Never returns while it holds."""
        while True:
            await asyncio.sleep(self.probe_s)
            try:
                await asyncio.wait_for(self._conn.fetchval("SELECT 1"), timeout=max(self.probe_s * 4, 2.0))
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError, AttributeError) as exc:
                log.error("scheduler.leadership_lost", error=repr(exc))
                return

    async def release(self) -> None:
        """Give up the lock (closing the session releases it)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), timeout=2)
            if not conn.is_closed():
                conn.terminate()

    def terminate_for_test(self) -> None:
        """Cut the session without a goodbye, as a crashed process would."""
        if self._conn is not None:
            self._conn.terminate()
