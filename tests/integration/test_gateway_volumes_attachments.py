"""Volumes and allocations through the gateway: a volume named in an allocation request (sent with it, checked
first), a live attach to an ACTIVE allocation and its detach (sent to the storage service with the node and the
allocation's address), and the mounts an instance shows. The allocation, network and storage services are
played by publishing their events."""
from __future__ import annotations

import uuid

import pytest

from tests.integration.test_gateway_volumes import announce_classes, available, create, shown, storage_says
from tests.support.gateway import assert_problem, outbox_count, project

AT = "2030-01-01T00:00:00Z"


@pytest.fixture
async def classes(api, nc) -> dict:
    return await announce_classes(api, nc)


async def allocation(client, **over) -> dict:
    r = await client.post("/v1/allocations", {"name": f"a-{uuid.uuid4().hex[:8]}", "shape": "vm.1gpu", **over})
    assert r.status == 202, r.body
    return r.body


async def activate(api, nc, client, alloc: dict, *, ip_address: str | None = None, instance: dict | None = None) -> str:
    """Play the network service (an address, when given) and the allocation service (ACTIVE on a node); the node."""
    node_id, tenant_id = str(uuid.uuid4()), alloc["tenant_id"]
    if ip_address:
        attachment = {"attachment_id": str(uuid.uuid4()), "allocation_id": alloc["id"], "network_id": str(uuid.uuid4()),
                      "ip_address": ip_address, "prefix_len": 24, "mac_address": "52:54:00:00:00:07"}
        saga = uuid.uuid4()
        await project(api, nc, "network.network_attached", {
            "saga_id": saga, "step": "attach_network", "idempotency_key": f"{saga}:attach_network",
            "allocation_id": alloc["id"], "attachment_id": attachment["attachment_id"], "vni": 4242,
            "ip_address": ip_address, "mac_address": attachment["mac_address"], "node_id": node_id,
            "attachment": attachment, "tenant_networks": {"tenant_id": tenant_id, "version": 1, "networks": []}},
            tenant_id)
    saga = uuid.uuid4()
    await project(api, nc, "allocation.activated", {
        "allocation_id": alloc["id"], "tenant_id": tenant_id, "state": "ACTIVE", "at": AT, "saga_id": saga,
        "step": "activate", "idempotency_key": f"{saga}:activate", "node_id": node_id,
        **({"instance": {**instance, "node_id": node_id}} if instance else {})}, tenant_id)
    return node_id


async def test_a_volume_named_in_an_allocation_request_is_sent_with_it_and_refused_when_it_cannot_be_mounted(
        api, nc, watch, classes):
    client, tenant_id = await api.tenant_user()
    commands = await watch("allocation.cmd.request")
    data, shared = await available(api, nc, client), await available(api, nc, client, shared=True)
    a = await allocation(client, volumes=[{"volume_id": data["id"]}, {"volume_id": shared["id"], "mode": "ro"}],
                         scratch_class="fast", volume_gb=5)
    assert a["volumes"] == [{"volume_id": data["id"], "mode": "rw"}, {"volume_id": shared["id"], "mode": "ro"}]
    [(_, env, _)] = await commands.wait_for(lambda i: i[1]["data"]["allocation_id"] == a["id"])
    assert (env["data"]["volumes"], env["data"]["scratch_class"], env["data"]["volume_gb"]) == (a["volumes"], "fast", 5)
    assert (await client.get(f"/v1/allocations/{a['id']}")).body["volumes"] == a["volumes"]
    creating = await create(client)
    refusals = [
        ([{"volume_id": data["id"]}], "not shared"),                       # requested by the live allocation above
        ([{"volume_id": creating["id"]}], "creating"),
        ([{"volume_id": shared["id"]}, {"volume_id": shared["id"]}], "named twice"),
        ([{"volume_id": str(uuid.uuid4())}], "no such volume"),
    ]
    for volumes, message in refusals:
        problem = assert_problem(await client.post("/v1/allocations", {"name": "x", "shape": "vm.1gpu",
                                                                       "volumes": volumes}), 422)
        assert message in problem["errors"][0]["message"] and problem["errors"][0]["field"].endswith(".volume_id")
    for volumes in ([{"volume_id": shared["id"], "mode": "rx"}], [{"volume_id": "nope"}], [{"id": shared["id"]}],
                    [{"volume_id": str(uuid.uuid4())} for _ in range(17)], {"volume_id": shared["id"]}):
        assert_problem(await client.post("/v1/allocations", {"name": "x", "shape": "vm.1gpu", "volumes": volumes}), 422)
    # a shared volume in use is mounted by another allocation too
    await storage_says(api, nc, shared, 3, "in-use", attachments=[
        {"allocation_id": a["id"], "mode": "ro", "node_id": str(uuid.uuid4()), "state": "attached"}])
    await allocation(client, volumes=[{"volume_id": shared["id"], "mode": "ro"}])
    assert await api.commands_of("allocation.request", tenant_id) == 2


async def test_a_live_attach_needs_an_active_allocation_of_the_tenant_and_is_sent_with_its_node_and_address(
        api, nc, watch, classes):
    client, tenant_id = await api.tenant_user()
    other, _ = await api.tenant_user()
    commands = await watch("storage.cmd.attach_volume")
    v = await available(api, nc, client)
    path = f"/v1/volumes/{v['id']}/attachments"
    waiting = await allocation(client)
    problem = assert_problem(await client.post(path, {"allocation_id": waiting["id"]}), 409)
    assert "name the volume in the allocation request instead" in problem["detail"]
    assert_problem(await client.post(path, {"allocation_id": (await allocation(other))["id"]}), 404)
    assert_problem(await client.post(path, {"allocation_id": str(uuid.uuid4())}), 404)
    for body in ({"allocation_id": waiting["id"], "mode": "rx"}, {"allocation_id": "x"}, {}, {"mode": "ro"},
                 {"allocation_id": waiting["id"], "state": "attached"}):
        assert_problem(await client.post(path, body), 422)
    node_id = await activate(api, nc, client, waiting, ip_address="10.0.0.7")
    r = await client.post(path, {"allocation_id": waiting["id"], "mode": "ro"})
    assert r.status == 202 and r.body["attachments"] == [
        {"allocation_id": waiting["id"], "mode": "ro", "node_id": node_id, "state": "attaching", "reason": None}]
    [(_, env, _)] = await commands.wait_for(lambda i: i[1]["data"]["volume_id"] == v["id"])
    assert env["data"] == {"volume_id": v["id"], "tenant_id": tenant_id, "allocation_id": waiting["id"], "mode": "ro",
                           "node_id": node_id, "ip_address": "10.0.0.7"}
    assert_problem(await client.post(path, {"allocation_id": waiting["id"]}), 409)          # already attached
    second = await allocation(client)
    await activate(api, nc, client, second)
    problem = assert_problem(await client.post(path, {"allocation_id": second["id"]}), 409)   # not shared
    assert problem["type"].endswith("/volume-in-use")
    shared = await available(api, nc, client, shared=True)
    for alloc in (waiting, second):
        assert (await client.post(f"/v1/volumes/{shared['id']}/attachments", {"allocation_id": alloc["id"]})).status == 202
    assert await api.commands_of("storage.attach_volume", tenant_id) == 3


async def test_detach_is_sent_once_and_the_volume_shows_what_the_storage_service_says(api, nc, watch, classes):
    client, tenant_id = await api.tenant_user()
    commands = await watch("storage.cmd.detach_volume")
    v = await available(api, nc, client)
    alloc = await allocation(client)
    node_id = await activate(api, nc, client, alloc)
    path = f"/v1/volumes/{v['id']}/attachments/{alloc['id']}"
    assert_problem(await client.delete(path), 404)                                           # nothing attached yet
    assert (await client.post(f"/v1/volumes/{v['id']}/attachments", {"allocation_id": alloc["id"]})).status == 202
    assert_problem(await client.delete(path), 409)                                           # still attaching
    attached = {"allocation_id": alloc["id"], "mode": "rw", "node_id": node_id, "state": "attached", "reason": None}
    await storage_says(api, nc, v, 3, "in-use", attachments=[attached])
    await shown(client, v["id"], lambda b: b["state"] == "in-use" and b["attachments"] == [attached])
    r = await client.delete(path)
    assert r.status == 202 and r.body["attachments"] == [{**attached, "state": "detaching"}]
    assert (await client.delete(path)).status == 202                                         # again: nothing more sent
    [(_, env, _)] = await commands.wait_for(lambda i: i[1]["data"]["volume_id"] == v["id"])
    assert env["data"] == {"volume_id": v["id"], "tenant_id": tenant_id, "allocation_id": alloc["id"]}
    assert await outbox_count(api, "storage.detach_volume", "volume_id", v["id"]) == 1
    assert_problem(await client.delete(f"/v1/volumes/{v['id']}/attachments/{uuid.uuid4()}"), 404)
    assert_problem(await client.delete(f"/v1/volumes/{v['id']}/attachments/not-a-uuid"), 404)
    await storage_says(api, nc, v, 4, "available")
    await shown(client, v["id"], lambda b: b["attachments"] == [])


async def test_an_allocations_scratch_volume_is_listed_and_cannot_be_resized_attached_or_named(api, nc, classes):
    client, tenant_id = await api.tenant_user()
    alloc = await allocation(client, volume_gb=10)
    node_id = await activate(api, nc, client, alloc, instance={
        "instance_id": "tessera-x", "driver": "libvirt", "dataplane": "kernel", "passthrough": "simulated",
        "mounts": [{"volume_id": str(uuid.uuid4()), "name": "scratch", "mount_point": "/mnt/scratch", "mode": "rw",
                    "via": "virtiofs", "tag": "vol0", "simulated": False}]})
    [mount] = (await client.get(f"/v1/allocations/{alloc['id']}")).body["instance"]["mounts"]
    assert (mount["mount_point"], mount["via"], mount["tag"]) == ("/mnt/scratch", "virtiofs", "vol0")
    scratch = {"id": mount["volume_id"], "tenant_id": tenant_id, "user_id": None, "name": f"scratch-{alloc['id'][:8]}",
               "storage_class": "standard", "backend": "btrfs", "size_bytes": 10 * 10 ** 9, "shared": False}
    await storage_says(api, nc, scratch, 1, "in-use", scratch=True, attachments=[
        {"allocation_id": alloc["id"], "mode": "rw", "node_id": node_id, "state": "attached"}])
    listed = await shown(client, scratch["id"], lambda b: b.get("scratch"))
    assert listed["id"] in [i["id"] for i in (await client.get("/v1/volumes")).body["items"]]
    assert_problem(await client.call("PATCH", f"/v1/volumes/{scratch['id']}", json_body={"size_bytes": 10 ** 11}), 409)
    assert_problem(await client.post(f"/v1/volumes/{scratch['id']}/attachments", {"allocation_id": alloc["id"]}), 409)
    assert_problem(await client.delete(f"/v1/volumes/{scratch['id']}"), 409)
    problem = assert_problem(await client.post("/v1/allocations", {"name": "x", "shape": "vm.1gpu",
                                                                   "volumes": [{"volume_id": scratch["id"]}]}), 422)
    assert "scratch" in problem["errors"][0]["message"]
    quotas = (await client.get(f"/v1/tenants/{tenant_id}/storage-quotas")).body["items"]
    assert [q["provisioned_bytes"] for q in quotas if q["storage_class"] == "standard"] == [10 * 10 ** 9]
