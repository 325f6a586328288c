"""Real infrastructure for every test layer above unit: a nats-server with JetStream and a
PostgreSQL server, started once per test session by the suite itself (never mocked)."""
from __future__ import annotations

import asyncio
import json
import os
import secrets
import uuid
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import nats
import pytest

from shared.db import provision_service, service_dsn
from tooling.embedded import EmbeddedNats, EmbeddedPostgres
from shared.envelope import Envelope, utcnow


@dataclass
class Infra:
    nats: EmbeddedNats
    pg: EmbeddedPostgres
    secret: str
    workdir: Path

    @property
    def nats_url(self) -> str:
        return self.nats.url

    @property
    def admin_dsn(self) -> str:
        return self.pg.admin_dsn


@pytest.fixture(scope="session")
def infra(tmp_path_factory) -> Infra:
    work = tmp_path_factory.mktemp("infra")
    n = EmbeddedNats(work / "nats").start()
    pg = EmbeddedPostgres(work / "pg", durable=False).start()
    yield Infra(n, pg, secrets.token_hex(8), work)
    n.stop()
    pg.stop()


@pytest.fixture(scope="session")
async def provision(infra):
    """provision(service) -> DSN of that service's own role (schema and role created once)."""
    done: dict[str, str] = {}

    async def _provision(service: str) -> str:
        if service not in done:
            admin = await asyncpg.connect(infra.admin_dsn)
            try:
                await provision_service(admin, service, infra.secret)
            finally:
                await admin.close()
            done[service] = service_dsn(infra.admin_dsn, service, infra.secret)
        return done[service]

    return _provision


@pytest.fixture(scope="session")
async def nc(infra):
    client = await nats.connect(infra.nats_url)
    yield client
    await client.drain()


def make_envelope(type_: str, data: dict, *, tenant_id: uuid.UUID | None = None, correlation_id: str | None = None) -> Envelope:
    return Envelope(id=uuid.uuid4(), type=type_, schema_version=1, occurred_at=utcnow(), tenant_id=tenant_id,
                    correlation_id=correlation_id or str(uuid.uuid4()), data=json.loads(json.dumps(data, default=str)))


async def publish_envelope(js, subject: str, env: Envelope, *, msg_id: str | None = None) -> None:
    headers = env.headers()
    if msg_id:
        headers["Nats-Msg-Id"] = msg_id
    await js.publish(subject, env.model_dump_json().encode(), headers=headers)


class StreamWatcher:
    """Collects envelopes from a subject (ephemeral ordered consumer) and waits for a predicate."""

    def __init__(self):
        self.items: list[tuple[str, dict, dict]] = []
        self._changed = asyncio.Condition()
        self.sub = None

    async def start(self, js, subject: str):
        async def cb(msg):
            async with self._changed:
                self.items.append((msg.subject, json.loads(msg.data), dict(msg.headers or {})))
                self._changed.notify_all()
        self.sub = await js.subscribe(subject, cb=cb, ordered_consumer=True,
                                      deliver_policy=nats.js.api.DeliverPolicy.NEW)
        return self

    async def wait_for(self, predicate, timeout: float = 20.0):
        async def _wait():
            async with self._changed:
                while True:
                    hits = [i for i in self.items if predicate(i)]
                    if hits:
                        return hits
                    await self._changed.wait()
        return await asyncio.wait_for(_wait(), timeout)

    async def stop(self):
        if self.sub:
            await self.sub.unsubscribe()


@pytest.fixture
async def watch(nc):
    watchers = []

    async def _watch(subject: str) -> StreamWatcher:
        w = await StreamWatcher().start(nc.jetstream(), subject)
        watchers.append(w)
        return w

    yield _watch
    for w in watchers:
        await w.stop()


def pytest_report_header(config):
    return f"tessera: running as uid {os.geteuid()}"


async def send_command(js, type_: str, data: dict, *, env: Envelope | None = None,
                       msg_id: str | None = None) -> tuple[Envelope, int]:
    """Publish a message on its contract subject (or re-publish ``env`` under another Nats-Msg-Id,
    which the server cannot dedupe); returns the envelope and its stream sequence."""
    from shared.contract import load_catalog

    corr = str(data["allocation_id"]) if data.get("allocation_id") else None
    env = env or make_envelope(type_, data, tenant_id=data.get("tenant_id"), correlation_id=corr)
    headers = env.headers()
    if msg_id:
        headers["Nats-Msg-Id"] = msg_id
    ack = await js.publish(load_catalog().message(type_).subject, env.model_dump_json().encode(), headers=headers)
    return env, ack.seq


async def wait_handled(js, service: str, type_: str, seq: int, timeout: float = 20.0) -> None:
    """Wait until ``service``'s consumer for ``type_`` has delivered stream seq ``seq`` and nothing awaits an ack."""
    from shared.contract import load_catalog

    stream = load_catalog().owner(type_).stream
    durable = f"{service}__{type_.replace('.', '_')}"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        info = await js.consumer_info(stream, durable)
        if info.num_ack_pending == 0 and info.delivered.stream_seq >= seq:
            return
        assert loop.time() < deadline, f"{durable} has not handled seq {seq}: {info}"
        await asyncio.sleep(0.02)
