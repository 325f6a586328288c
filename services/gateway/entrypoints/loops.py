"""Periodic work, run by the runtime for the life of the process: forget idempotency keys once their retention
has passed."""
from __future__ import annotations

import asyncio

import structlog

from shared.runtime import Runtime

from ..adapters import allocations as repo

log = structlog.get_logger()


async def purge_idempotency_keys_forever(rt: Runtime, ttl_s: float, every_s: float = 600.0) -> None:
    """Delete keys older than ``ttl_s`` every ``every_s``; a key may be reused after that (runs until cancelled)."""
    while True:
        async with rt.pool.acquire() as conn:
            purged = await repo.purge_idempotency_keys(conn, ttl_s)
        if purged:
            log.info("idempotency_keys.purged", count=purged)
        await asyncio.sleep(every_s)
