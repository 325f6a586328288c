"""Live attach and detach (the node-agent played by the test, answering on its node's subject), the usage
report read from btrfs qgroups, and the classes announced on start; real NATS JetStream, PostgreSQL and btrfs."""
from __future__ import annotations

import uuid

import pytest

from services.storage.adapters.backends.btrfs import run_command
from shared.wire import step_key
from tests.support.bus import publish_from_node, send_command
from tests.support.volumes import MB, MiB, command, create, start_storage, volume_event

pytestmark = pytest.mark.root
IP = "10.20.0.9"


def attach(vol: dict, alloc, node, mode: str = "rw") -> dict:
    return {"volume_id": vol["volume_id"], "tenant_id": vol["tenant_id"], "allocation_id": alloc, "mode": mode,
            "node_id": node, "ip_address": IP}


async def node_reports(nc, vol: dict, alloc, node, *, mounted: bool, ok: bool = True, reason: str | None = None):
    await publish_from_node(nc, "node_agent.volume_mount_changed", node, {
        "node_id": node, "allocation_id": alloc, "tenant_id": vol["tenant_id"], "volume_id": vol["volume_id"],
        "mounted": mounted, "ok": ok, "reason": reason}, tenant_id=vol["tenant_id"])


async def test_a_live_attach_is_mounted_by_the_node_and_a_detach_unmounted(run_service, nc, watch, btrfs_pool):
    await start_storage(run_service, btrfs_pool)
    node, alloc = uuid.uuid4(), uuid.uuid4()
    js, events, node_cmds = nc.jetstream(), await watch("storage.evt.>"), await watch(f"node_agent.cmd.*.{node}")
    vol = await create(js, events, uuid.uuid4(), 20 * MB, name="models")
    attaching = await command(js, events, "storage.attach_volume", attach(vol, alloc, node, "ro"))
    assert attaching["attachments"] == [{"allocation_id": str(alloc), "mode": "ro", "node_id": str(node),
                                         "state": "attaching", "reason": None}]
    [mount] = await node_cmds.wait_for(lambda i: i[1]["type"] == "node_agent.mount_volume")
    assert mount[0] == f"node_agent.cmd.mount_volume.{node}"
    assert mount[1]["data"]["export"] == {
        "volume_id": vol["volume_id"], "name": "models", "mode": "ro", "backend": "btrfs",
        "source": str(btrfs_pool.path(vol["tenant_id"], vol["volume_id"])),
        "options": {"subvolid": str(btrfs_pool.subvolid(btrfs_pool.path(vol["tenant_id"], vol["volume_id"])))}}
    assert btrfs_pool.exports(vol["volume_id"])["clients"] == {IP: "ro"}
    await node_reports(nc, vol, alloc, node, mounted=True)
    [hit] = await events.wait_for(volume_event(vol["volume_id"], lambda v: v["attachments"][:1] and
                                               v["attachments"][0]["state"] == "attached"))
    assert hit[1]["data"]["volume"]["state"] == "in-use"
    detaching = await command(js, events, "storage.detach_volume", {"volume_id": vol["volume_id"],
                                                                   "tenant_id": vol["tenant_id"], "allocation_id": alloc})
    assert detaching["attachments"][0]["state"] == "detaching"
    [unmount] = await node_cmds.wait_for(lambda i: i[1]["type"] == "node_agent.unmount_volume")
    assert unmount[0] == f"node_agent.cmd.unmount_volume.{node}" and unmount[1]["data"]["volume_id"] == vol["volume_id"]
    await node_reports(nc, vol, alloc, node, mounted=False)
    [done] = await events.wait_for(volume_event(vol["volume_id"], lambda v: v["version"] > detaching["version"]))
    assert done[1]["data"]["volume"]["attachments"] == []
    assert done[1]["data"]["volume"]["state"] == "available"
    assert btrfs_pool.exports(vol["volume_id"])["clients"] == {}


async def test_a_mount_the_node_could_not_make_fails_the_attachment_with_its_reason(run_service, nc, watch, btrfs_pool):
    await start_storage(run_service, btrfs_pool)
    node, alloc = uuid.uuid4(), uuid.uuid4()
    js, events = nc.jetstream(), await watch("storage.evt.>")
    vol = await create(js, events, uuid.uuid4(), 20 * MB)
    await command(js, events, "storage.attach_volume", attach(vol, alloc, node))
    await node_reports(nc, vol, alloc, node, mounted=False, ok=False, reason="mount: permission denied")
    [hit] = await events.wait_for(volume_event(vol["volume_id"], lambda v: v["attachments"][:1] and
                                               v["attachments"][0]["state"] == "failed"))
    failed = hit[1]["data"]["volume"]
    assert (failed["state"], failed["reason"]) == ("available", "mount: permission denied")
    assert failed["attachments"][0]["reason"] == "mount: permission denied"
    assert btrfs_pool.exports(vol["volume_id"])["clients"] == {}
    again = await command(js, events, "storage.attach_volume", attach(vol, alloc, node))   # a new try replaces it
    assert [a["state"] for a in again["attachments"]] == ["attaching"] and again["reason"] is None


async def test_a_volume_that_is_not_shared_attaches_to_one_allocation_a_shared_one_to_several(
        run_service, nc, watch, btrfs_pool):
    await start_storage(run_service, btrfs_pool)
    node, first, second = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    js, events = nc.jetstream(), await watch("storage.evt.>")
    tenant = uuid.uuid4()
    single = await create(js, events, tenant, 20 * MB)
    shared = await create(js, events, tenant, 20 * MB, shared=True)
    await command(js, events, "storage.attach_volume", attach(single, first, node))
    refused = await command(js, events, "storage.attach_volume", attach(single, second, node))
    assert [a["allocation_id"] for a in refused["attachments"]] == [str(first)]
    assert refused["reason"] == f"volume {single['name']!r} is attached to allocation {first} and is not shared"
    await command(js, events, "storage.attach_volume", attach(shared, first, node, "ro"))
    both = await command(js, events, "storage.attach_volume", attach(shared, second, node, "ro"))
    assert [a["allocation_id"] for a in both["attachments"]] == [str(first), str(second)] and both["reason"] is None


async def test_a_volume_attached_without_a_node_is_detached_at_once(run_service, nc, watch, btrfs_pool):
    await start_storage(run_service, btrfs_pool)
    alloc, tenant, saga = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    js, events = nc.jetstream(), await watch("storage.evt.>")
    vol = await create(js, events, tenant, 20 * MB)
    await send_command(js, "storage.provision_volume", {
        "saga_id": saga, "step": "provision_volume", "idempotency_key": step_key(saga, "provision_volume"),
        "allocation_id": alloc, "tenant_id": tenant, "volumes": [{"volume_id": vol["volume_id"]}]})
    await events.wait_for(volume_event(vol["volume_id"], lambda v: v["state"] == "in-use"))
    detached = await command(js, events, "storage.detach_volume", {"volume_id": vol["volume_id"], "tenant_id": tenant,
                                                                  "allocation_id": alloc})
    assert (detached["state"], detached["attachments"]) == ("available", [])


async def test_usage_is_reported_per_tenant_as_the_qgroup_counts_it_and_a_failing_volume_is_left_out(
        run_service, nc, watch, btrfs_pool):
    usage = await watch("storage.evt.usage_reported")
    rt = await start_storage(run_service, btrfs_pool, usage_interval_s=0.2)
    js, events = nc.jetstream(), await watch("storage.evt.volume_changed")
    tenant = uuid.uuid4()
    vol = await create(js, events, tenant, 40 * MB)
    lost = await create(js, events, tenant, 20 * MB)
    await run_command(["btrfs", "subvolume", "delete", "--commit-after",
                       str(btrfs_pool.path(tenant, lost["volume_id"]))], 60)       # behind the service's back
    path = btrfs_pool.path(tenant, vol["volume_id"])
    btrfs_pool.write(path, 8)
    [*_, hit] = await usage.wait_for(lambda i: i[1]["data"]["tenant_id"] == str(tenant) and any(
        v["used_bytes"] >= 8 * MiB for v in i[1]["data"]["volumes"]))
    referenced, limit = btrfs_pool.qgroup_of(path)
    assert hit[1]["data"]["volumes"] == [{"volume_id": vol["volume_id"], "used_bytes": referenced, "limit_bytes": limit}]
    assert limit == 40 * MB and referenced >= 8 * MiB
    async with rt.pool.acquire() as conn:
        assert await conn.fetchval("SELECT used_bytes FROM volumes WHERE id=$1", uuid.UUID(vol["volume_id"])) == referenced


async def test_the_classes_on_offer_are_announced_on_start(run_service, watch, btrfs_pool):
    announced = await watch("storage.evt.classes_announced")
    await start_storage(run_service, btrfs_pool, {"vast": {"backend": "vast", "description": "VAST (recorded)",
                                                           "max_volume_bytes": 10 ** 12}}, default_quota_volumes=7)
    [*_, hit] = await announced.wait_for(lambda i: len(i[1]["data"]["classes"]) == 2)
    data = hit[1]["data"]
    assert data["classes"] == [
        {"name": "standard", "backend": "btrfs", "description": "", "max_volume_bytes": 1 << 50, "default": True,
         "simulated": False},
        {"name": "vast", "backend": "vast", "description": "VAST (recorded)", "max_volume_bytes": 10 ** 12,
         "default": False, "simulated": True}]
    assert (data["default_quota_bytes"], data["default_quota_volumes"]) == (100_000 * 10 ** 9, 7)
