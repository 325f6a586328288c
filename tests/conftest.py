"""Real infrastructure for every test layer above unit: a nats-server with JetStream and a
PostgreSQL server, started once per test session by the suite itself (never mocked)."""
from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import nats
import pytest

from shared.db import provision_service, service_dsn
from tests.support.bus import StreamWatcher
from tooling.embedded import EmbeddedNats, EmbeddedPostgres


@dataclass
class Infra:
    nats: EmbeddedNats
    pg: EmbeddedPostgres
    secret: str
    workdir: Path

    @property
    def nats_url(self) -> str:
        return self.nats.url

    def connect_options(self, identity: str = "admin") -> dict:
        """Keyword arguments for ``nats.connect(infra.nats_url, ...)`` as ``identity`` (the harness: ``admin``)."""
        return self.nats.connect_options(identity)

    def nkey_file(self, identity: str) -> str:
        """The seed file of ``identity`` (a service's name, ``ops``, ``admin``, or a node-agent's
        ``shared.bus_identity.node_identity(node_id)``, created and the server reloaded when new): a service's
        TESSERA_NATS_NKEY_FILE."""
        return str(self.nats.identities.add(identity))

    @property
    def admin_dsn(self) -> str:
        return self.pg.admin_dsn


@pytest.fixture(scope="session")
def infra(tmp_path_factory) -> Infra:
    work = tmp_path_factory.mktemp("infra")
    n = EmbeddedNats(work / "nats").start()
    try:
        pg = EmbeddedPostgres(work / "pg", durable=False).start()
        try:
            yield Infra(n, pg, secrets.token_hex(8), work)
        finally:
            pg.stop()
    finally:
        n.stop()


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
    client = await nats.connect(infra.nats_url, **infra.connect_options("admin"))
    yield client
    await client.drain()


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
