"""The whole platform, every service its own process, on its own NATS JetStream and PostgreSQL
(started for this package and stopped after it, so no other test's consumers or nodes mix in)."""
from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass

import asyncpg
import nats
import pytest

from tests.support.cleanup import release_everything
from tests.support.platform import E2E_ENV
from tooling.client import TesseraClient
from tooling.platform import Platform


@pytest.fixture(scope="package")
async def platform(tmp_path_factory):
    work = tmp_path_factory.mktemp("platform")
    env = {**E2E_ENV, "TESSERA_TRACE_FILE": str(work / "traces.jsonl")}
    p = Platform(work, env=env, durable=False)
    await p.start()   # a start that fails stops what it started
    try:   # so does a failure after it (a node that does not come up)
        p.node_ids = [await p.add_node(f"e2e-{uuid.uuid4().hex[:6]}-{i}", "H100", 8) for i in range(2)]
        yield p
    finally:
        await p.stop()


@dataclass
class Tenant:
    id: str
    admin: TesseraClient
    user: TesseraClient
    user_id: str


@pytest.fixture
async def admin(platform):
    async with platform.admin() as c:
        yield c


@pytest.fixture
async def make_tenant(platform, admin):
    clients = []

    async def _make() -> Tenant:
        t = await admin.create_tenant(f"t-{uuid.uuid4().hex[:8]}")
        await admin.set_quota(t["id"], "shared", "H100", 64)
        ta = await admin.create_user(t["id"], "owner", "tenant_admin")
        tu = await admin.create_user(t["id"], "researcher", "tenant_user")
        a = await TesseraClient(platform.gateway_url, ta["api_key"]).__aenter__()
        u = await TesseraClient(platform.gateway_url, tu["api_key"]).__aenter__()
        clients.extend([a, u])
        return Tenant(t["id"], a, u, tu["id"])

    yield _make
    try:
        await asyncio.gather(*(release_everything(c) for c in clients[::2]))   # each tenant's admin
    finally:
        for c in clients:
            await c.__aexit__(None, None, None)


@pytest.fixture
async def tenant(make_tenant):
    return await make_tenant()


@pytest.fixture
async def platform_nc(platform):
    client = await nats.connect(platform.nats_url, **platform.connect_options("admin"))
    yield client
    await client.drain()


@pytest.fixture
async def db(platform):
    """A superuser connection to inspect every service's schema (verification only)."""
    conn = await asyncpg.connect(platform.database_url)
    yield conn
    await conn.close()
