"""The whole platform, every service its own process, on its own NATS JetStream and PostgreSQL
(started for this package and stopped after it, so no other test's consumers or nodes mix in)."""
from __future__ import annotations

import uuid
from dataclasses import dataclass

import asyncpg
import nats
import pytest

from tooling.client import TesseraClient
from tooling.platform import Platform

E2E_ENV = {
    "TESSERA_SIM_FAULTS": "1",                 # honour the sim fault label (never set in production)
    "TESSERA_SAGA_STEP_TIMEOUT_S": "4",
    "TESSERA_SAGA_COMPENSATION_TIMEOUT_S": "3",
    "TESSERA_SAGA_BACKOFF_S": "0.2,0.5,1",
    "TESSERA_ACK_WAIT_S": "10",
    "TESSERA_RETRY_BACKOFF_S": "0.1,0.3,1",
    "TESSERA_LOG_LEVEL": "INFO",
    "TESSERA_SCHEDULER_PREEMPTION_GRACE_S": "1",   # the preemption notice's grace period
}


@pytest.fixture(scope="package")
async def platform(tmp_path_factory):
    work = tmp_path_factory.mktemp("platform")
    env = {**E2E_ENV, "TESSERA_TRACE_FILE": str(work / "traces.jsonl")}
    p = Platform(work, env=env, durable=False)
    await p.start()
    p.node_ids = [await p.add_node(f"e2e-{uuid.uuid4().hex[:6]}-{i}", "H100", 8) for i in range(2)]
    yield p
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
    for c in clients:
        await c.__aexit__(None, None, None)


@pytest.fixture
async def tenant(make_tenant):
    return await make_tenant()


@pytest.fixture
async def platform_nc(platform):
    client = await nats.connect(platform.nats_url)
    yield client
    await client.drain()


@pytest.fixture
async def db(platform):
    """A superuser connection to inspect every service's schema (verification only)."""
    conn = await asyncpg.connect(platform.database_url)
    yield conn
    await conn.close()


async def leftovers(db: asyncpg.Connection, allocation_id: str) -> dict[str, int]:
    """What any service still holds for an allocation (all zero after release or compensation)."""
    aid = uuid.UUID(allocation_id)
    return {
        "slots": await db.fetchval("SELECT count(*) FROM scheduler.slots WHERE allocation_id=$1", aid),
        "attachments": await db.fetchval("SELECT count(*) FROM network.attachments WHERE allocation_id=$1", aid),
        "volumes": await db.fetchval("SELECT count(*) FROM storage.volumes WHERE allocation_id=$1", aid),
        "instances": await db.fetchval("SELECT count(*) FROM node_agent.instances WHERE allocation_id=$1", aid),
        "running_meters": await db.fetchval("SELECT count(*) FROM billing.meters WHERE allocation_id=$1 AND stopped_at IS NULL", aid),
    }
