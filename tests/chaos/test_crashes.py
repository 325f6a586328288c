"""kill -9 in the middle of a saga: the coordinator resumes from PostgreSQL; a dead node-agent's step
times out and the saga compensates. Each test gets its own platform, since it kills processes."""
from __future__ import annotations

import signal
import uuid

import asyncpg
import pytest

from tests.support.platform import E2E_ENV, NOTHING_LEFT, leftovers
from tests.support.polling import eventually
from tooling.client import TesseraClient
from tooling.platform import Platform


@pytest.fixture
async def fresh_platform(tmp_path):
    platforms = []

    async def _make(env: dict[str, str] | None = None, node_env: dict[str, str] | None = None):
        # its own NATS and PostgreSQL: this test kills processes and leaves nodes behind
        p = Platform(tmp_path / f"p{len(platforms)}", env={**E2E_ENV, **(env or {})}, durable=False)
        platforms.append(p)
        await p.start()
        # a node of its own, big enough that no other test's allocations interfere
        p.node_id = await p.add_node(f"chaos-{uuid.uuid4().hex[:8]}", "H100", 8, env=node_env)
        async with p.admin() as admin:
            t = await admin.create_tenant(f"chaos-{uuid.uuid4().hex[:6]}")
            await admin.set_quota(t["id"], "shared", "H100", 64)
            u = await admin.create_user(t["id"], "u", "tenant_user")
        p.tenant_key = u["api_key"]
        return p

    yield _make
    for p in platforms:
        await p.stop()


async def wait_saga_step(db: asyncpg.Connection, allocation_id: str, step: str, timeout: float = 30.0) -> None:
    """Wait until the coordinator has persisted (and so sent) the invoke of ``step``."""
    await eventually(lambda: db.fetchval(
        "SELECT st.status FROM saga.saga_steps st JOIN saga.sagas s ON s.id = st.saga_id "
        "WHERE s.allocation_id=$1 AND s.kind='allocate' AND st.step=$2 AND st.phase='invoke'",
        uuid.UUID(allocation_id), step), until=lambda status: status is not None, timeout=timeout, interval=0.02,
        what=f"step {step} to start")


async def node_agent_settled(p: Platform, db: asyncpg.Connection, key: str) -> bool:
    """The provision key is tombstoned and the node's consumers have nothing left to deliver."""
    status = await db.fetchval("SELECT status FROM node_agent.step_outcomes WHERE idempotency_key=$1", key)
    if status != "compensated":
        return False
    import nats
    nc = await nats.connect(p.nats_url, **p.connect_options("admin"))
    try:
        js = nc.jetstream()
        infos = [i for i in await js.consumers_info("TESSERA_NODE_AGENT") if p.node_id.replace("-", "") in i.name]
        return bool(infos) and all(i.num_pending == 0 and i.num_ack_pending == 0 for i in infos)
    finally:
        await nc.close()


async def test_saga_coordinator_killed_mid_saga_resumes_and_completes(fresh_platform):
    # the node-agent takes 2 s per operation, so the saga is surely mid-flight when it is killed
    p = await fresh_platform(node_env={"TESSERA_SIM_LATENCY_S": "2"})
    db = await asyncpg.connect(p.database_url)
    try:
        async with TesseraClient(p.gateway_url, p.tenant_key) as tenant:
            a = await tenant.create_allocation("survivor", shape="vm.1gpu", volume_gb=5)
            await wait_saga_step(db, a["id"], "provision_node")
            p.kill("saga", signal.SIGKILL)
            assert p.procs["saga"].proc.returncode == -signal.SIGKILL
            await p.restart("saga")
            active = await tenant.wait_state(a["id"], {"ACTIVE", "FAILED"}, timeout=60)
            assert active["state"] == "ACTIVE", active
            await tenant.release(a["id"])
            await tenant.wait_state(a["id"], "RELEASED", timeout=60)
            assert await leftovers(db, a["id"]) == NOTHING_LEFT
    finally:
        await db.close()


async def test_node_agent_killed_mid_step_times_out_and_the_saga_compensates(fresh_platform):
    p = await fresh_platform(env={"TESSERA_SAGA_COMPENSATION_ATTEMPTS": "2"},
                             node_env={"TESSERA_SIM_LATENCY_S": "30"})
    db = await asyncpg.connect(p.database_url)
    try:
        async with TesseraClient(p.gateway_url, p.tenant_key) as tenant:
            a = await tenant.create_allocation("orphan", shape="vm.1gpu", volume_gb=5)
            await wait_saga_step(db, a["id"], "provision_node")
            agent = f"node_agent:{p.node_id}"
            p.kill(agent, signal.SIGKILL)
            failed = await tenant.wait_state(a["id"], {"FAILED", "ACTIVE"}, timeout=90)
            assert failed["state"] == "FAILED" and failed["failed_step"] == "provision_node"
            assert "timed out" in failed["reason"]
            left = await leftovers(db, a["id"])
            assert left["slots"] == 0 and left["attachments"] == 0 and left["volumes"] == 0 and left["running_meters"] == 0
            # the node-agent comes back (repaired: no more slowness): the queued undos run, and the
            # redelivered provision finds the tombstone and does nothing
            await p.restart(agent, env={"TESSERA_SIM_LATENCY_S": "0"})
            saga_id = await db.fetchval("SELECT id FROM saga.sagas WHERE allocation_id=$1 AND kind='allocate'",
                                        uuid.UUID(a["id"]))
            await eventually(lambda: node_agent_settled(p, db, f"{saga_id}:provision_node"), timeout=90,
                             what="the node-agent to settle")
            assert (await leftovers(db, a["id"]))["instances"] == 0
    finally:
        await db.close()
