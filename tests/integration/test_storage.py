"""The provision_volume saga step and its undo against real NATS JetStream, PostgreSQL and btrfs: the scratch
volume and the named volumes attached and exported, refusals that leave nothing behind, undo, tombstones,
redelivery and dead-lettering."""
from __future__ import annotations

import uuid

import asyncpg
import pytest

from shared.wire import step_key
from tests.support.bus import caused_by, of, send_malformed_then_valid, wait_handled
from tests.support.bus import send_command as send
from tests.support.volumes import MB, command, create, set_quota, start_storage, volume_event

pytestmark = pytest.mark.root
GB = 10 ** 9
IP = "10.20.0.7"


def provision_cmd(alloc, tenant, size_gb: int, saga=None, **fields) -> dict:
    saga = saga or uuid.uuid4()
    return {"saga_id": saga, "step": "provision_volume", "idempotency_key": step_key(saga, "provision_volume"),
            "allocation_id": alloc, "tenant_id": tenant, "size_gb": size_gb, **fields}


def delete_cmd(alloc, tenant, saga, compensates: str | None = None) -> dict:
    return {"saga_id": saga, "step": "delete_volume", "idempotency_key": step_key(saga, "delete_volume"),
            "allocation_id": alloc, "tenant_id": tenant, "compensates": compensates}


async def step(js, events, type_: str, data: dict) -> dict:
    """Send a step command; returns its reply (the data of the one step reply it caused)."""
    env, _ = await send(js, type_, data)
    [hit] = await events.wait_for(lambda i: caused_by(env)(i) and i[1]["type"] != "storage.volume_changed")
    return {"type": hit[1]["type"], **hit[1]["data"]}


async def rows(rt, query: str, *args) -> list[asyncpg.Record]:
    async with rt.pool.acquire() as conn:
        return await conn.fetch(query, *args)


async def test_provision_makes_the_scratch_volume_attaches_named_ones_and_answers_every_export(
        run_service, nc, watch, btrfs_pool):
    await start_storage(run_service, btrfs_pool)
    js, events = nc.jetstream(), await watch("storage.evt.>")
    alloc, tenant, user, node = uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    data = await create(js, events, tenant, 30 * MB, name="data")
    ref = await create(js, events, tenant, 20 * MB, name="ref", shared=True)
    reply = await step(js, events, "storage.provision_volume", provision_cmd(
        alloc, tenant, 1, user_id=user, node_id=node, ip_address=IP,
        volumes=[{"volume_id": data["volume_id"]}, {"volume_id": ref["volume_id"], "mode": "ro"}]))
    assert reply["type"] == "storage.volume_provisioned" and reply["size_gb"] == 1
    scratch_id = reply["volume_id"]
    scratch_path = btrfs_pool.path(tenant, scratch_id)
    assert [(e["volume_id"], e["name"], e["mode"], e["backend"]) for e in reply["exports"]] == [
        (scratch_id, f"scratch-{alloc.hex[:8]}", "rw", "btrfs"), (data["volume_id"], "data", "rw", "btrfs"),
        (ref["volume_id"], "ref", "ro", "btrfs")]
    assert reply["exports"][0]["source"] == str(scratch_path) and "subvolid" in reply["exports"][0]["options"]
    assert btrfs_pool.qgroup_of(scratch_path)[1] == GB
    assert btrfs_pool.exports(ref["volume_id"])["clients"] == {IP: "ro"}
    assert btrfs_pool.exports(scratch_id)["clients"] == {IP: "rw"}
    [scratch] = await events.wait_for(volume_event(scratch_id))
    doc = scratch[1]["data"]["volume"]
    assert (doc["scratch"], doc["state"], doc["user_id"], doc["size_bytes"]) == (True, "in-use", str(user), GB)
    assert doc["attachments"] == [{"allocation_id": str(alloc), "mode": "rw", "node_id": str(node),
                                   "state": "attached", "reason": None}]
    [attached] = await events.wait_for(volume_event(ref["volume_id"], lambda v: v["version"] == 2))
    assert attached[1]["data"]["volume"]["state"] == "in-use"


async def test_a_volume_of_another_tenant_or_unknown_fails_the_step_as_not_found_leaving_nothing(
        run_service, nc, watch, btrfs_pool):
    rt = await start_storage(run_service, btrfs_pool)
    js, events = nc.jetstream(), await watch("storage.evt.>")
    tenant, other = uuid.uuid4(), uuid.uuid4()
    theirs = await create(js, events, other, 10 * MB)
    for volume_id in (theirs["volume_id"], str(uuid.uuid4())):
        alloc = uuid.uuid4()
        reply = await step(js, events, "storage.provision_volume", provision_cmd(
            alloc, tenant, 1, ip_address=IP, volumes=[{"volume_id": volume_id}]))
        assert (reply["type"], reply["reason"]) == ("storage.volume_provision_failed", f"volume {volume_id} not found")
    assert btrfs_pool.subvolumes(tenant) == []
    assert await rows(rt, "SELECT 1 FROM volumes WHERE tenant_id=$1", tenant) == []
    assert btrfs_pool.exports(theirs["volume_id"]) is None


async def test_a_volume_attached_elsewhere_unless_shared_or_over_quota_scratch_fails_the_step(
        run_service, nc, watch, btrfs_pool):
    await start_storage(run_service, btrfs_pool)
    js, events = nc.jetstream(), await watch("storage.evt.>")
    tenant = uuid.uuid4()
    single = await create(js, events, tenant, 10 * MB, name="single")
    first = await step(js, events, "storage.provision_volume", provision_cmd(
        uuid.uuid4(), tenant, 0, volumes=[{"volume_id": single["volume_id"]}]))
    assert first["type"] == "storage.volume_provisioned" and first["volume_id"] is None
    second = await step(js, events, "storage.provision_volume", provision_cmd(
        uuid.uuid4(), tenant, 0, volumes=[{"volume_id": single["volume_id"]}]))
    assert second["type"] == "storage.volume_provision_failed" and "is not shared" in second["reason"]
    await set_quota(js, events, tenant, max_bytes=GB)
    over = await step(js, events, "storage.provision_volume", provision_cmd(uuid.uuid4(), tenant, 1))
    assert over["reason"] == (f"quota storage:standard:bytes exceeded: limit {GB} bytes, used {10 * MB} bytes, "
                              f"requested {GB} bytes")
    assert len(btrfs_pool.subvolumes(tenant)) == 1


async def test_undo_detaches_every_volume_and_destroys_the_scratch_leaving_nothing_on_disk(
        run_service, nc, watch, btrfs_pool):
    rt = await start_storage(run_service, btrfs_pool)
    js, events = nc.jetstream(), await watch("storage.evt.>")
    alloc, tenant, saga = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    named = await create(js, events, tenant, 10 * MB, name="keep")
    reply = await step(js, events, "storage.provision_volume", provision_cmd(
        alloc, tenant, 1, saga, ip_address=IP, volumes=[{"volume_id": named["volume_id"]}]))
    scratch_path = btrfs_pool.path(tenant, reply["volume_id"])
    qgroup = f"0/{btrfs_pool.subvolid(scratch_path)}"
    refused = await command(js, events, "storage.destroy_volume", {"volume_id": named["volume_id"], "tenant_id": tenant})
    assert refused["state"] == "in-use" and "detach it first" in refused["reason"]
    for _ in range(2):   # idempotent
        undone = await step(js, events, "storage.delete_volume", delete_cmd(alloc, tenant, saga))
        assert undone["type"] == "storage.volume_deleted"
    assert not scratch_path.exists() and qgroup not in btrfs_pool.qgroups()
    assert btrfs_pool.exports(reply["volume_id"]) is None
    assert btrfs_pool.exports(named["volume_id"])["clients"] == {}
    assert btrfs_pool.subvolumes(tenant) == [btrfs_pool.path(tenant, named["volume_id"])]
    states = {str(r["id"]): r["state"] for r in await rows(rt, "SELECT id, state FROM volumes WHERE tenant_id=$1", tenant)}
    assert states == {reply["volume_id"]: "deleted", named["volume_id"]: "available"}
    assert await rows(rt, "SELECT 1 FROM attachments WHERE allocation_id=$1", alloc) == []


async def test_a_backend_failure_fails_the_step_with_its_reason_and_leaves_nothing(
        run_service, nc, watch, btrfs_pool, tmp_path):
    rt = await start_storage(run_service, btrfs_pool, {"broken": {"backend": "btrfs", "root": str(tmp_path)}})
    js, events = nc.jetstream(), await watch("storage.evt.>")
    alloc, tenant = uuid.uuid4(), uuid.uuid4()
    named = await create(js, events, tenant, 10 * MB)
    reply = await step(js, events, "storage.provision_volume", provision_cmd(
        alloc, tenant, 1, scratch_class="broken", ip_address=IP, volumes=[{"volume_id": named["volume_id"]}]))
    assert reply["type"] == "storage.volume_provision_failed" and str(tmp_path) in reply["reason"]
    assert await rows(rt, "SELECT 1 FROM volumes WHERE allocation_id=$1", alloc) == []
    assert await rows(rt, "SELECT 1 FROM attachments WHERE allocation_id=$1", alloc) == []
    assert btrfs_pool.exports(named["volume_id"]) is None
    unknown = await step(js, events, "storage.provision_volume", provision_cmd(uuid.uuid4(), tenant, 1,
                                                                              scratch_class="gold"))
    assert unknown["reason"] == "unknown storage class 'gold'; offered: standard, broken"


async def test_provision_delivered_twice_makes_one_scratch_volume(run_service, nc, watch, btrfs_pool):
    rt = await start_storage(run_service, btrfs_pool)
    js, events = nc.jetstream(), await watch("storage.evt.>")
    alloc, tenant = uuid.uuid4(), uuid.uuid4()
    env, _ = await send(js, "storage.provision_volume", provision_cmd(alloc, tenant, 2))
    _, seq = await send(js, "storage.provision_volume", {}, env=env, msg_id=f"again-{env.id}")
    [hit] = await events.wait_for(of(alloc, "storage.volume_provisioned"))
    await wait_handled(js, "storage", "storage.provision_volume", seq)
    [row] = await rows(rt, "SELECT id, size_bytes FROM volumes WHERE allocation_id=$1", alloc)
    assert (str(row["id"]), row["size_bytes"], hit[1]["data"]["size_gb"]) == (hit[1]["data"]["volume_id"], 2 * GB, 2)
    assert btrfs_pool.subvolumes(tenant) == [btrfs_pool.path(tenant, row["id"])]


async def test_compensation_before_the_provision_leaves_a_tombstone_so_the_late_provision_fails(
        run_service, nc, watch, btrfs_pool):
    rt = await start_storage(run_service, btrfs_pool)
    js, events = nc.jetstream(), await watch("storage.evt.>")
    alloc, tenant, saga = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    await send(js, "storage.delete_volume", delete_cmd(alloc, tenant, saga, compensates=step_key(saga, "provision_volume")))
    await events.wait_for(of(alloc, "storage.volume_deleted"))
    await send(js, "storage.provision_volume", provision_cmd(alloc, tenant, 1, saga))
    [hit] = await events.wait_for(of(alloc, "storage.volume_provision_failed"))
    assert "compensated" in hit[1]["data"]["reason"]
    assert await rows(rt, "SELECT 1 FROM volumes WHERE allocation_id=$1", alloc) == []
    assert btrfs_pool.subvolumes(tenant) == []


async def test_malformed_provision_is_dead_lettered_and_the_next_valid_one_is_still_handled(
        run_service, nc, watch, btrfs_pool):
    rt = await start_storage(run_service, btrfs_pool)
    js, events = nc.jetstream(), await watch("storage.evt.>")
    bad, good, tenant = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    dead = await send_malformed_then_valid(js, watch, "storage.provision_volume", provision_cmd(bad, tenant, 1),
                                           "tenant_id", provision_cmd(good, tenant, 1))
    assert dead == "deadletter.storage.storage__storage_provision_volume"
    await events.wait_for(of(good, "storage.volume_provisioned"))
    assert await rows(rt, "SELECT 1 FROM volumes WHERE allocation_id=$1", bad) == []
    assert len(await rows(rt, "SELECT 1 FROM volumes WHERE allocation_id=$1", good)) == 1
