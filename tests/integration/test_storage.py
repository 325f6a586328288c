"""Storage against real NATS JetStream and PostgreSQL: provision/delete steps, quotas (also under
concurrency), tombstones, redelivery and dead-lettering."""
from __future__ import annotations

import uuid

import asyncpg

from services.storage import handlers
from services.storage.bootstrap import build
from services.storage.contracts import ProvisionVolume
from services.storage.domain.model import StoragePolicy
from shared.wire import step_key
from tests.support.bus import caused_by, of, send_command as send, send_malformed_then_valid, wait_handled
from tests.support.concurrency import run_handler_concurrently


def provision_cmd(alloc: uuid.UUID, tenant: uuid.UUID, size_gb: int, saga: uuid.UUID | None = None) -> dict:
    saga = saga or uuid.uuid4()
    return {"saga_id": saga, "step": "provision_volume", "idempotency_key": step_key(saga, "provision_volume"),
            "allocation_id": alloc, "tenant_id": tenant, "size_gb": size_gb}


def delete_cmd(alloc: uuid.UUID, tenant: uuid.UUID, saga: uuid.UUID, compensates: str | None = None) -> dict:
    return {"saga_id": saga, "step": "delete_volume", "idempotency_key": step_key(saga, "delete_volume"),
            "allocation_id": alloc, "tenant_id": tenant, "compensates": compensates}


async def request_volume(js, events, alloc: uuid.UUID, tenant: uuid.UUID, size_gb: int) -> dict:
    env, _ = await send(js, "storage.provision_volume", provision_cmd(alloc, tenant, size_gb))
    [hit] = await events.wait_for(caused_by(env))
    return hit[1]


async def volumes(rt, alloc: uuid.UUID) -> list[asyncpg.Record]:
    async with rt.pool.acquire() as conn:
        return await conn.fetch("SELECT * FROM volumes WHERE allocation_id=$1", alloc)


async def set_quota(rt, tenant: uuid.UUID, max_gb: int) -> None:
    async with rt.pool.acquire() as conn:
        await conn.execute("INSERT INTO tenant_quotas (tenant_id, max_gb) VALUES ($1, $2)", tenant, max_gb)


async def test_provision_delivered_twice_creates_one_volume(run_service, nc, watch):
    rt = await run_service("storage", build)
    js, events = nc.jetstream(), await watch("storage.evt.>")
    alloc, tenant = uuid.uuid4(), uuid.uuid4()
    env, _ = await send(js, "storage.provision_volume", provision_cmd(alloc, tenant, 250))
    _, seq = await send(js, "storage.provision_volume", {}, env=env, msg_id=f"again-{env.id}")
    [hit] = await events.wait_for(of(alloc, "storage.volume_provisioned"))
    await wait_handled(js, "storage", "storage.provision_volume", seq)
    [row] = await volumes(rt, alloc)
    assert (str(row["id"]), row["size_gb"], row["tenant_id"]) == (hit[1]["data"]["volume_id"], 250, tenant)
    assert hit[1]["data"]["size_gb"] == 250


async def test_a_zero_size_request_provisions_no_volume(run_service, nc, watch):
    rt = await run_service("storage", build)
    js, events = nc.jetstream(), await watch("storage.evt.>")
    alloc = uuid.uuid4()
    reply = await request_volume(js, events, alloc, uuid.uuid4(), 0)
    assert reply["type"] == "storage.volume_provisioned"
    assert (reply["data"]["volume_id"], reply["data"]["size_gb"]) == (None, 0)
    assert await volumes(rt, alloc) == []


async def test_a_volume_over_the_tenant_quota_fails_naming_limit_and_use_and_creates_nothing(run_service, nc, watch):
    rt = await run_service("storage", build)
    js, events = nc.jetstream(), await watch("storage.evt.>")
    tenant = uuid.uuid4()
    await set_quota(rt, tenant, 100)
    assert (await request_volume(js, events, uuid.uuid4(), tenant, 60))["type"] == "storage.volume_provisioned"
    alloc = uuid.uuid4()
    reply = await request_volume(js, events, alloc, tenant, 50)
    assert reply["type"] == "storage.volume_provision_failed"
    reason = reply["data"]["reason"]
    assert "quota exceeded" in reason and "limit 100 GB" in reason and "current use 60 GB" in reason
    assert await volumes(rt, alloc) == []
    assert (await request_volume(js, events, uuid.uuid4(), tenant, 40))["type"] == "storage.volume_provisioned"


async def test_the_default_quota_comes_from_the_environment(run_service, nc, watch, monkeypatch):
    monkeypatch.setenv("TESSERA_STORAGE_DEFAULT_QUOTA_GB", "10")
    rt = await run_service("storage", build)
    js, events = nc.jetstream(), await watch("storage.evt.>")
    alloc = uuid.uuid4()
    reply = await request_volume(js, events, alloc, uuid.uuid4(), 11)
    assert reply["type"] == "storage.volume_provision_failed" and "limit 10 GB" in reply["data"]["reason"]
    assert await volumes(rt, alloc) == []


async def test_delete_removes_the_volume_idempotently_and_frees_the_quota(run_service, nc, watch):
    rt = await run_service("storage", build)
    js, events = nc.jetstream(), await watch("storage.evt.>")
    alloc, tenant, saga = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    await set_quota(rt, tenant, 100)
    await request_volume(js, events, alloc, tenant, 100)
    for _ in range(2):
        env, _ = await send(js, "storage.delete_volume", delete_cmd(alloc, tenant, saga))
        [hit] = await events.wait_for(caused_by(env))
        assert hit[1]["type"] == "storage.volume_deleted"
    assert await volumes(rt, alloc) == []
    assert (await request_volume(js, events, uuid.uuid4(), tenant, 100))["type"] == "storage.volume_provisioned"


async def test_compensation_before_the_provision_leaves_a_tombstone_so_the_late_provision_fails(run_service, nc, watch):
    rt = await run_service("storage", build)
    js, events = nc.jetstream(), await watch("storage.evt.>")
    alloc, tenant, saga = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    await send(js, "storage.delete_volume", delete_cmd(alloc, tenant, saga, compensates=step_key(saga, "provision_volume")))
    await events.wait_for(of(alloc, "storage.volume_deleted"))
    await send(js, "storage.provision_volume", provision_cmd(alloc, tenant, 10, saga))
    [hit] = await events.wait_for(of(alloc, "storage.volume_provision_failed"))
    assert "compensated" in hit[1]["data"]["reason"]
    assert await volumes(rt, alloc) == []


async def test_concurrent_provisions_for_one_tenant_never_exceed_its_quota(run_service, provision):
    rt = await run_service("storage", build)
    tenant = uuid.uuid4()
    await set_quota(rt, tenant, 100)
    cmds = [ProvisionVolume(**provision_cmd(uuid.uuid4(), tenant, 30)) for _ in range(10)]
    await run_handler_concurrently(rt, await provision("storage"), "storage.provision_volume", cmds,   # one transaction each
                                   lambda uow, cmd: handlers.provision_volume(uow, cmd, policy=StoragePolicy()))
    async with rt.pool.acquire() as conn:
        statuses = await conn.fetch("SELECT status FROM step_outcomes WHERE idempotency_key = ANY($1::text[])",
                                    [c.idempotency_key for c in cmds])
        used = await conn.fetchval("SELECT sum(size_gb) FROM volumes WHERE tenant_id=$1", tenant)
    assert sorted(s["status"] for s in statuses) == ["done"] * 3 + ["failed"] * 7
    assert used == 90


async def test_malformed_provision_is_dead_lettered_and_the_next_valid_one_is_still_handled(run_service, nc, watch):
    rt = await run_service("storage", build)
    js, events = nc.jetstream(), await watch("storage.evt.>")
    bad, good, tenant = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    dead = await send_malformed_then_valid(js, watch, "storage.provision_volume", provision_cmd(bad, tenant, 10),
                                           "size_gb", provision_cmd(good, tenant, 10))
    assert dead == "deadletter.storage.storage__storage_provision_volume"
    await events.wait_for(of(good, "storage.volume_provisioned"))
    assert await volumes(rt, bad) == []
    assert len(await volumes(rt, good)) == 1
