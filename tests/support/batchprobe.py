"""A probe service for the kit's batch and crash tests: its own contract, stream and schema, nothing of any
real service. ``python -m tests.support.batchprobe`` runs it as its own process (so a test can kill it with
SIGKILL); ``build()`` gives the same service in-process.

Its handler records one ``effects`` row per ping (with the id of the transaction that wrote it) and emits one
``batchprobe.pinged``. A ping marked ``kill`` kills the process with SIGKILL once its transaction has
committed, before any message of the batch is acknowledged; one marked ``poison`` writes its effect, then
fails (its savepoint rolls the write back); one marked ``retract`` first emits a ``pinged`` with ``-n`` inside a
savepoint of its own that it rolls back.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import signal

from nats.js.api import StreamConfig
from nats.js.errors import NotFoundError
from pydantic import BaseModel, ConfigDict

from shared.contract import Message, ServiceContract
from shared.runtime import Runtime
from shared.steps import Step
from shared.unit_of_work import UnitOfWork
from tests.support.bus import probe_runtime

SERVICE = "batchprobe"
STREAM = "TESSERA_BATCHPROBE"


async def fresh_stream(js) -> None:
    """The probe's stream, empty: deleted when there, then made again."""
    with contextlib.suppress(NotFoundError):
        await js.delete_stream(STREAM)
    await js.add_stream(StreamConfig(name=STREAM, subjects=["batchprobe.>"], duplicate_window=120))
PING, PINGED = "batchprobe.ping", "batchprobe.pinged"
CONSUMER = f"{SERVICE}__batchprobe_ping"
EFFECTS = "CREATE TABLE IF NOT EXISTS effects (n bigint NOT NULL, txid bigint NOT NULL, pid int NOT NULL)"


class Ping(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n: int
    kill: bool = False
    poison: bool = False
    retract: bool = False


CONTRACT = ServiceContract(
    service=SERVICE, title="batch probe", description="test-only service",
    messages=[Message(PING, "batchprobe.cmd.ping", Ping, "command", "ping"),
              Message(PINGED, "batchprobe.evt.pinged", Ping, "event", "pinged")],
    receives=[PING],
)


class _Retracted(Exception):
    pass


async def on_ping(ctx: UnitOfWork, ping: Ping) -> None:
    if ping.retract:   # an emit inside a savepoint of the handler's own, rolled back: it must never be published
        try:
            async with ctx.conn.transaction():
                await ctx.emit(PINGED, Ping(n=-ping.n))
                raise _Retracted
        except _Retracted:
            pass
    await ctx.conn.execute("INSERT INTO effects (n, txid, pid) VALUES ($1, txid_current(), $2)", ping.n, os.getpid())
    await ctx.emit(PINGED, ping)
    if ping.poison:
        raise RuntimeError(f"poison {ping.n}")
    if ping.kill:
        async def die() -> None:
            os.kill(os.getpid(), signal.SIGKILL)
        ctx.on_commit(die)


def build(nats_url: str, db_dsn: str, *, nkey_file: str | None = None, ack_wait_s: float = 2.0, batch_size: int = 64,
          max_workers: int = 1, notice: bool = False, even_only: bool = False) -> Runtime:
    """The probe; with ``notice`` its ping is consumed as a saga's notice (a step command with no reply and no
    idempotency key, like ``allocation.fail``) through ``participate``; with ``even_only`` it follows
    only the pings of an even ``n`` (an ``interest`` that asks the database, as the paas's does)."""
    rt = probe_runtime(CONTRACT, nats_url, db_dsn, nkey_file=nkey_file, ack_wait_s=ack_wait_s, max_workers=max_workers,
                       batch_size=batch_size)
    if notice:
        rt.consumers.participate(Step(CONTRACT.messages[0]), invoke=on_ping)
    else:
        rt.consumers.subscribe(PING, on_ping, interest=_even if even_only else None)
    return rt


async def _even(conn, pings: list[Ping]) -> list[bool]:
    return list(await conn.fetchval("SELECT array_agg(n % 2 = 0 ORDER BY i) FROM unnest($1::bigint[]) "
                                    "WITH ORDINALITY AS p(n, i)", [p.n for p in pings]))


if __name__ == "__main__":
    asyncio.run(build(os.environ["TESSERA_NATS_URL"], os.environ["TESSERA_DB_DSN"],
                      nkey_file=os.environ.get("TESSERA_NATS_NKEY_FILE")).run_forever())
