"""Tenant volumes against real NATS JetStream, PostgreSQL and a real btrfs file system: create, quotas (bytes,
count, a user's share; also under concurrency), resize, destroy, and a destroyed volume's data."""
from __future__ import annotations

import uuid
from functools import partial

import pytest

from services.storage import handlers
from services.storage.bootstrap import build
from services.storage.contracts import CreateVolume
from tests.support.bus import caused_by, send_command, wait_handled
from tests.support.concurrency import run_handler_concurrently
from tests.support.volumes import MB, MiB, command, create, set_quota, start_storage, storage_settings

pytestmark = pytest.mark.root


def quota_reason(quota: str, limit: int, used: int, requested: int, unit: str = "bytes") -> str:
    one = unit[:-1]
    return (f"quota {quota} exceeded: limit {limit} {one if limit == 1 else unit}, used {used} "
            f"{one if used == 1 else unit}, requested {requested} {one if requested == 1 else unit}")


async def test_a_created_volume_is_a_subvolume_limited_to_its_size_and_a_repeat_changes_nothing(
        run_service, nc, watch, btrfs_pool):
    await start_storage(run_service, btrfs_pool)
    js, events = nc.jetstream(), await watch("storage.evt.>")
    tenant, user = uuid.uuid4(), uuid.uuid4()
    vol = await create(js, events, tenant, 40 * MB, name="datasets", user=user)
    assert (vol["state"], vol["version"], vol["size_bytes"], vol["backend"]) == ("available", 1, 40 * MB, "btrfs")
    assert (vol["name"], vol["user_id"], vol["reason"], vol["attachments"]) == ("datasets", str(user), None, [])
    path = btrfs_pool.path(tenant, vol["volume_id"])
    assert btrfs_pool.subvolumes(tenant) == [path]
    assert btrfs_pool.qgroup_of(path)[1] == 40 * MB
    again = await create(js, events, tenant, 40 * MB, name="datasets", user=user, volume_id=vol["volume_id"])
    assert again == vol and btrfs_pool.subvolumes(tenant) == [path]


async def test_a_create_is_rejected_for_an_unknown_class_a_size_over_the_class_maximum_or_a_name_in_use(
        run_service, nc, watch, btrfs_pool):
    await start_storage(run_service, btrfs_pool, {"small": {"backend": "btrfs", "max_volume_bytes": 10 * MB}})
    js, events = nc.jetstream(), await watch("storage.evt.>")
    tenant = uuid.uuid4()
    unknown = await create(js, events, tenant, 5 * MB, storage_class="gold")
    assert unknown["state"] == "rejected" and unknown["reason"] == "unknown storage class 'gold'; offered: standard, small"
    big = await create(js, events, tenant, 11 * MB, storage_class="small")
    assert big["state"] == "rejected" and "more than storage class 'small' allows" in big["reason"]
    assert (await create(js, events, tenant, 5 * MB, name="home"))["state"] == "available"
    taken = await create(js, events, tenant, 5 * MB, name="home", storage_class="small")
    assert taken["state"] == "rejected" and taken["reason"] == "a volume named 'home' exists already"
    assert len(btrfs_pool.subvolumes(tenant)) == 1


async def test_a_tenant_quota_in_bytes_and_in_volumes_refuses_naming_the_quota_its_limit_and_the_use(
        run_service, nc, watch, btrfs_pool):
    await start_storage(run_service, btrfs_pool)
    js, events = nc.jetstream(), await watch("storage.evt.>")
    tenant = uuid.uuid4()
    changed = await set_quota(js, events, tenant, max_bytes=100 * MB, max_volumes=2)
    assert (changed["effective_max_bytes"], changed["effective_max_volumes"], changed["version"]) == (100 * MB, 2, 1)
    assert (await create(js, events, tenant, 60 * MB))["state"] == "available"
    over = await create(js, events, tenant, 50 * MB)
    assert over["state"] == "rejected"
    assert over["reason"] == quota_reason("storage:standard:bytes", 100 * MB, 60 * MB, 50 * MB)
    assert (await create(js, events, tenant, 40 * MB))["state"] == "available"      # exactly full
    await set_quota(js, events, tenant, max_bytes=200 * MB, max_volumes=2)
    third = await create(js, events, tenant, MiB)
    assert third["reason"] == quota_reason("storage:standard:volumes", 2, 2, 1, "volumes")
    assert len(btrfs_pool.subvolumes(tenant)) == 2


async def test_the_default_quotas_come_from_the_settings(run_service, nc, watch, btrfs_pool):
    await start_storage(run_service, btrfs_pool, default_quota_volumes=1, default_quota_gb=1)
    js, events = nc.jetstream(), await watch("storage.evt.>")
    tenant = uuid.uuid4()
    assert (await create(js, events, tenant, 10 * MB))["state"] == "available"
    refused = await create(js, events, tenant, 10 * MB)
    assert refused["reason"] == quota_reason("storage:standard:volumes", 1, 1, 1, "volumes")
    changed = await set_quota(js, events, tenant, max_volumes=5)
    assert (changed["effective_max_bytes"], changed["effective_max_volumes"]) == (10 ** 9, 5)
    too_big = await create(js, events, tenant, 10 ** 9)
    assert too_big["reason"] == quota_reason("storage:standard:bytes", 10 ** 9, 10 * MB, 10 ** 9)


async def test_concurrent_creates_across_the_quota_boundary_never_exceed_it(run_service, provision, btrfs_pool):
    settings = storage_settings(btrfs_pool)
    rt = await run_service("storage", partial(build, storage=settings))
    tenant = uuid.uuid4()
    async with rt.pool.acquire() as conn:
        await conn.execute("INSERT INTO quotas (tenant_id, storage_class, max_bytes) VALUES ($1, 'standard', $2)",
                           tenant, 100 * MB)
    cmds = [CreateVolume(volume_id=uuid.uuid4(), tenant_id=tenant, user_id=uuid.uuid4(), name=f"c{i}",
                         storage_class="standard", size_bytes=30 * MB) for i in range(12)]
    policy, backends = settings.policy, settings.backends()
    await run_handler_concurrently(rt, await provision("storage"), "storage.create_volume", cmds,   # one transaction each
                                   lambda uow, cmd: handlers.create_volume(uow, cmd, policy=policy, backends=backends))
    async with rt.pool.acquire() as conn:
        rows = await conn.fetch("SELECT id, state, size_bytes, reason FROM volumes WHERE tenant_id=$1", tenant)
    available = [r for r in rows if r["state"] == "available"]
    assert len(rows) == 12 and len(available) == 3
    assert sum(r["size_bytes"] for r in available) <= 100 * MB
    assert all(r["reason"].startswith("quota storage:standard:bytes exceeded: limit 100000000 bytes, used 90000000")
               for r in rows if r["state"] == "rejected")
    assert btrfs_pool.subvolumes(tenant) == sorted(btrfs_pool.path(tenant, r["id"]) for r in available)


async def test_one_create_delivered_concurrently_makes_one_volume_and_keeps_it(run_service, provision, btrfs_pool):
    settings = storage_settings(btrfs_pool)
    rt = await run_service("storage", partial(build, storage=settings))
    tenant = uuid.uuid4()
    cmd = CreateVolume(volume_id=uuid.uuid4(), tenant_id=tenant, user_id=uuid.uuid4(), name="once",
                       storage_class="standard", size_bytes=10 * MB)
    policy, backends = settings.policy, settings.backends()
    await run_handler_concurrently(rt, await provision("storage"), "storage.create_volume", [cmd] * 4,
                                   lambda uow, cmd: handlers.create_volume(uow, cmd, policy=policy, backends=backends))
    async with rt.pool.acquire() as conn:
        [row] = await conn.fetch("SELECT state FROM volumes WHERE tenant_id=$1", tenant)
    assert row["state"] == "available"
    assert btrfs_pool.subvolumes(tenant) == [btrfs_pool.path(tenant, cmd.volume_id)]


async def test_a_users_share_limits_that_user_within_the_tenants_quota(run_service, nc, watch, btrfs_pool):
    await start_storage(run_service, btrfs_pool)
    js, events = nc.jetstream(), await watch("storage.evt.>")
    tenant, alice, bob = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    await set_quota(js, events, tenant, max_bytes=200 * MB)
    share = await set_quota(js, events, tenant, user=alice, max_bytes=50 * MB)
    assert (share["user_id"], share["effective_max_bytes"], share["effective_max_volumes"]) == (str(alice), 50 * MB, 100)
    assert (await create(js, events, tenant, 30 * MB, user=alice))["state"] == "available"
    over = await create(js, events, tenant, 30 * MB, user=alice)
    assert over["reason"] == quota_reason("storage:standard:user:bytes", 50 * MB, 30 * MB, 30 * MB)
    assert (await create(js, events, tenant, 30 * MB, user=bob))["state"] == "available"   # no share: the tenant's


async def test_a_volume_only_grows_and_not_past_the_quota(run_service, nc, watch, btrfs_pool):
    await start_storage(run_service, btrfs_pool)
    js, events = nc.jetstream(), await watch("storage.evt.>")
    tenant = uuid.uuid4()
    await set_quota(js, events, tenant, max_bytes=100 * MB)
    vol = await create(js, events, tenant, 40 * MB)
    path = btrfs_pool.path(tenant, vol["volume_id"])

    async def resize(size: int) -> dict:
        return await command(js, events, "storage.resize_volume", {
            "volume_id": vol["volume_id"], "tenant_id": tenant, "request_id": uuid.uuid4(), "size_bytes": size})

    grown = await resize(60 * MB)
    assert (grown["size_bytes"], grown["version"], grown["reason"]) == (60 * MB, 2, None)
    assert btrfs_pool.qgroup_of(path)[1] == 60 * MB
    shrink = await resize(50 * MB)
    assert shrink["size_bytes"] == 60 * MB and "cannot shrink" in shrink["reason"]
    await create(js, events, tenant, 30 * MB)
    over = await resize(80 * MB)
    assert over["size_bytes"] == 60 * MB
    assert over["reason"] == quota_reason("storage:standard:bytes", 100 * MB, 90 * MB, 20 * MB)
    assert btrfs_pool.qgroup_of(path)[1] == 60 * MB
    assert (await resize(70 * MB))["size_bytes"] == 70 * MB                   # exactly full


async def test_destroy_removes_the_subvolume_and_its_qgroup_and_frees_name_and_quota(run_service, nc, watch, btrfs_pool):
    await start_storage(run_service, btrfs_pool)
    js, events = nc.jetstream(), await watch("storage.evt.>")
    tenant = uuid.uuid4()
    await set_quota(js, events, tenant, max_volumes=1)
    vol = await create(js, events, tenant, 20 * MB, name="work")
    path = btrfs_pool.path(tenant, vol["volume_id"])
    qgroup = f"0/{btrfs_pool.subvolid(path)}"
    destroy = {"volume_id": vol["volume_id"], "tenant_id": tenant}
    gone = await command(js, events, "storage.destroy_volume", destroy)
    assert (gone["state"], gone["version"]) == ("deleted", 2)
    assert not path.exists() and qgroup not in btrfs_pool.qgroups()
    assert await command(js, events, "storage.destroy_volume", destroy) == gone           # a repeat
    assert (await create(js, events, tenant, 20 * MB, name="work"))["state"] == "available"


async def test_a_destroyed_volumes_data_cannot_be_read_from_a_new_volume(run_service, nc, watch, btrfs_pool):
    await start_storage(run_service, btrfs_pool)
    js, events = nc.jetstream(), await watch("storage.evt.>")
    tenant = uuid.uuid4()
    old = await create(js, events, tenant, 20 * MB, name="secret")
    btrfs_pool.write(btrfs_pool.path(tenant, old["volume_id"]), 4, pattern=True)
    assert btrfs_pool.holds_pattern(btrfs_pool.path(tenant, old["volume_id"]))
    await command(js, events, "storage.destroy_volume", {"volume_id": old["volume_id"], "tenant_id": tenant})
    new = await create(js, events, tenant, 20 * MB, name="secret")
    path = btrfs_pool.path(tenant, new["volume_id"])
    assert btrfs_pool.subvolumes(tenant) == [path]
    assert not btrfs_pool.holds_pattern(path) and not btrfs_pool.holds_pattern(btrfs_pool.root / "tenants" / str(tenant))


async def test_a_backend_that_refuses_rejects_the_create_with_its_reason(run_service, nc, watch, btrfs_pool, tmp_path):
    await start_storage(run_service, btrfs_pool, {"broken": {"backend": "btrfs", "root": str(tmp_path)}})
    js, events = nc.jetstream(), await watch("storage.evt.>")
    vol = await create(js, events, uuid.uuid4(), 10 * MB, storage_class="broken")
    assert vol["state"] == "rejected" and "btrfs" in vol["reason"] and str(tmp_path) in vol["reason"]
    assert not (tmp_path / "tenants").exists() or not any((tmp_path / "tenants").rglob("*"))


async def test_a_command_on_another_tenants_volume_changes_nothing_and_says_nothing(run_service, nc, watch, btrfs_pool):
    rt = await start_storage(run_service, btrfs_pool)
    js, events = nc.jetstream(), await watch("storage.evt.>")
    owner = uuid.uuid4()
    vol = await create(js, events, owner, 10 * MB)
    env, seq = await send_command(js, "storage.destroy_volume", {"volume_id": vol["volume_id"], "tenant_id": uuid.uuid4()})
    await wait_handled(js, "storage", "storage.destroy_volume", seq)
    mine = await command(js, events, "storage.resize_volume", {"volume_id": vol["volume_id"], "tenant_id": owner,
                                                              "request_id": uuid.uuid4(), "size_bytes": 12 * MB})
    assert (mine["state"], mine["size_bytes"], mine["version"]) == ("available", 12 * MB, 2)   # not destroyed
    assert not [i for i in events.items if caused_by(env)(i)]
    async with rt.pool.acquire() as conn:
        assert await conn.fetchval("SELECT state FROM volumes WHERE id=$1", uuid.UUID(vol["volume_id"])) == "available"
