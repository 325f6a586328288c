"""/v1/volumes through the gateway, against real NATS and PostgreSQL: writes travel to the storage service as
commands (asserted as sent), reads come from the gateway's projection of storage.* events, which these tests
publish as the storage service would (it is played here, not run)."""
from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from services.storage.contracts import MAX_VOLUME_BYTES, MIN_VOLUME_BYTES
from tests.support.gateway import PROJECTED_WITHIN_S, assert_problem, ensure_default_shapes, outbox_count, project
from tests.support.polling import eventually

GiB = 1 << 30
STANDARD_MAX = 1 << 40            # the standard class's largest volume: 1 TiB
FAST_MAX = 64 * GiB
CLASSES = {"classes": [
    {"name": "standard", "backend": "btrfs", "description": "btrfs on the storage hosts", "max_volume_bytes": STANDARD_MAX,
     "default": True, "simulated": False},
    {"name": "fast", "backend": "weka", "description": "WEKA", "max_volume_bytes": FAST_MAX, "default": False,
     "simulated": True}],
    # generous defaults: the session's other gateway tests share this view (a scratch volume is charged to them)
    "default_quota_bytes": 1 << 60, "default_quota_volumes": 1_000_000}


# --- playing the storage service ------------------------------------------------------------------------------

async def announce_classes(api, nc) -> dict:
    """The storage service announced its classes (the latest announcement is what the gateway offers), and the
    scheduler's default shapes are in the catalog (allocations name vm.1gpu)."""
    await project(api, nc, "storage.classes_announced", CLASSES)
    await ensure_default_shapes(api, nc)
    return CLASSES


@pytest.fixture
async def classes(api, nc) -> dict:
    return await announce_classes(api, nc)


def volume_doc(volume: dict, version: int, state: str, **over) -> dict:
    """A storage.volume_changed document of the volume the gateway accepted (``volume``: its 202 body)."""
    now = datetime.now(UTC).isoformat()
    doc = {"volume_id": volume["id"], "tenant_id": volume["tenant_id"], "user_id": volume["user_id"],
           "name": volume["name"], "storage_class": volume["storage_class"], "backend": volume["backend"] or "btrfs",
           "size_bytes": volume["size_bytes"], "used_bytes": None, "shared": volume["shared"], "scratch": False,
           "state": state, "reason": None, "attachments": [], "version": version, "created_at": now, "updated_at": now}
    doc.update(over)
    return doc


async def storage_says(api, nc, volume: dict, version: int, state: str, **over) -> dict:
    """Publish the volume's document as the storage service would and wait until the gateway handled it."""
    doc = volume_doc(volume, version, state, **over)
    await project(api, nc, "storage.volume_changed", {"volume": doc}, volume["tenant_id"])
    return doc


async def shown(client, volume_id: str, until) -> dict:
    """The volume as GET shows it once ``until(body)`` holds."""
    async def read():
        return (await client.get(f"/v1/volumes/{volume_id}")).body
    return await eventually(read, until=until, timeout=PROJECTED_WITHIN_S, what=f"volume {volume_id}")


async def create(client, name: str | None = None, size: int = GiB, **over) -> dict:
    r = await client.post("/v1/volumes", {"name": name or f"v-{uuid.uuid4().hex[:10]}", "size_bytes": size, **over})
    assert r.status == 202, r.body
    return r.body


async def available(api, nc, client, size: int = GiB, **over) -> dict:
    """A volume of the client's tenant that the storage service made (version 2, available)."""
    volume = await create(client, size=size, **over)
    await storage_says(api, nc, volume, 2, "available")
    return volume


async def volumes_sent(api, tenant_id: str, type_: str = "storage.create_volume") -> int:
    return await api.commands_of(type_, tenant_id)


# --- the tests ------------------------------------------------------------------------------------------------

async def test_a_created_volume_is_accepted_creating_sends_one_command_and_shows_the_newest_document(api, nc, watch,
                                                                                                   classes):
    client, tenant_id = await api.tenant_user()
    user_id = str(await api.scalar("SELECT id FROM users WHERE tenant_id=$1", uuid.UUID(tenant_id)))
    commands = await watch("storage.cmd.create_volume")
    r = await client.post("/v1/volumes", {"name": "datasets", "size_bytes": 10 * GiB})
    assert r.status == 202, r.body
    v = r.body
    assert r.headers["Location"] == f"/v1/volumes/{v['id']}" == v["links"]["self"]
    assert (v["state"], v["storage_class"], v["backend"], v["size_bytes"], v["shared"], v["mount_point"]) == (
        "creating", "standard", "btrfs", 10 * GiB, False, "/mnt/datasets")
    assert (v["tenant_id"], v["user_id"], v["attachments"], v["used_bytes"], v["scratch"]) == (tenant_id, user_id, [],
                                                                                             None, False)
    [(_, env, _)] = await commands.wait_for(lambda i: i[1]["data"]["volume_id"] == v["id"])
    assert env["data"] == {"volume_id": v["id"], "tenant_id": tenant_id, "user_id": user_id, "name": "datasets",
                           "storage_class": "standard", "size_bytes": 10 * GiB, "shared": False}
    assert (env["tenant_id"], env["correlation_id"]) == (tenant_id, v["id"])
    # the documents arrive out of order: the highest version stays
    await storage_says(api, nc, v, 3, "available", used_bytes=4096)
    await storage_says(api, nc, v, 1, "creating")
    got = await shown(client, v["id"], lambda b: b["state"] == "available")
    assert (got["used_bytes"], got["size_bytes"], got["created_at"]) == (4096, 10 * GiB, v["created_at"])
    assert [i["id"] for i in (await client.get("/v1/volumes")).body["items"]] == [v["id"]]
    fast = await create(client, "scratchpad", 2 * GiB, storage_class="fast", shared=True)
    assert (fast["storage_class"], fast["backend"], fast["shared"]) == ("fast", "weka", True)
    assert await volumes_sent(api, tenant_id) == 2


async def test_another_tenant_gets_404_for_every_volume_route_never_lists_it_and_cannot_mount_it(api, nc, classes):
    alice, alice_tenant = await api.tenant_user()
    bob, bob_tenant = await api.tenant_user("tenant_admin")
    v = await available(api, nc, alice)
    path = f"/v1/volumes/{v['id']}"
    for method, where, body in [("GET", path, None), ("DELETE", path, None), ("PATCH", path, {"size_bytes": 2 * GiB}),
                                ("POST", f"{path}/attachments", {"allocation_id": str(uuid.uuid4())}),
                                ("DELETE", f"{path}/attachments/{uuid.uuid4()}", None),
                                ("GET", f"/v1/volumes/{uuid.uuid4()}", None), ("GET", "/v1/volumes/not-a-uuid", None)]:
        assert_problem(await bob.call(method, where, json_body=body), 404)
    assert (await bob.get("/v1/volumes?limit=100")).body["items"] == []
    answers = []
    for volume_id in (v["id"], str(uuid.uuid4())):
        r = await bob.post("/v1/allocations", {"name": "thief", "shape": "vm.1gpu",
                                               "volumes": [{"volume_id": volume_id, "mode": "ro"}]})
        answers.append((r.status, assert_problem(r, 422, "volumes.0.volume_id")["errors"]))
    assert answers[0] == answers[1] == (422, [{"field": "volumes.0.volume_id", "message": "no such volume",
                                               "code": "volume"}])
    assert await api.commands_of("allocation.request", bob_tenant) == 0
    for type_ in ("storage.destroy_volume", "storage.resize_volume", "storage.attach_volume", "storage.detach_volume"):
        assert await volumes_sent(api, alice_tenant, type_) == await volumes_sent(api, bob_tenant, type_) == 0
    assert (await alice.get(path)).body["state"] == "available"


@pytest.mark.parametrize(("body", "field"), [
    ({"name": "zero", "size_bytes": 0}, "size_bytes"), ({"name": "neg", "size_bytes": -GiB}, "size_bytes"),
    ({"name": "tiny", "size_bytes": MIN_VOLUME_BYTES - 1}, "size_bytes"),
    ({"name": "huge", "size_bytes": MAX_VOLUME_BYTES + 1}, "size_bytes"),
    ({"name": "over-class", "size_bytes": STANDARD_MAX + 1}, "size_bytes"),
    ({"name": "over-fast", "size_bytes": FAST_MAX + 1, "storage_class": "fast"}, "size_bytes"),
    ({"name": "text", "size_bytes": "1073741824"}, "size_bytes"), ({"name": "frac", "size_bytes": GiB + 0.5}, "size_bytes"),
    ({"name": "nope", "size_bytes": GiB, "storage_class": "gold"}, "storage_class"),
    ({"name": "bad", "size_bytes": GiB, "storage_class": "Gold/../x"}, "storage_class"),
    ({"name": "a/b", "size_bytes": GiB}, "name"), ({"name": "..", "size_bytes": GiB}, "name"),
    ({"name": "../etc", "size_bytes": GiB}, "name"), ({"name": "a\u0000b", "size_bytes": GiB}, "name"),
    ({"name": "x" * 64, "size_bytes": GiB}, "name"), ({"name": "", "size_bytes": GiB}, "name"),
    ({"name": "Data", "size_bytes": GiB}, "name"), ({"name": "-lead", "size_bytes": GiB}, "name"),
    ({"name": "d\u00e9j\u00e0", "size_bytes": GiB}, "name"), ({"size_bytes": GiB}, "name"), ({"name": "n"}, "size_bytes"),
    ({"name": "s", "size_bytes": GiB, "shared": "yes"}, "shared"), ({"name": "o", "size_bytes": GiB, "state": "available"},
                                                                     "state"),
])
async def test_a_bad_volume_body_is_a_422_problem_naming_the_field_and_creates_and_sends_nothing(api, classes, body,
                                                                                                field):
    client, tenant_id = await api.tenant_user()
    problem = assert_problem(await client.post("/v1/volumes", body), 422, field)
    if field == "storage_class" and body["storage_class"] == "gold":
        assert "standard" in problem["errors"][0]["message"] and "fast" in problem["errors"][0]["message"]
    assert await volumes_sent(api, tenant_id) == 0
    assert await api.scalar("SELECT count(*) FROM volumes_view WHERE tenant_id=$1", uuid.UUID(tenant_id)) == 0


async def test_a_live_volumes_name_is_taken_until_it_is_deleted_or_rejected(api, nc, classes):
    client, tenant_id = await api.tenant_user()
    other, _ = await api.tenant_user()
    v = await available(api, nc, client)
    assert_problem(await client.post("/v1/volumes", {"name": v["name"], "size_bytes": GiB, "storage_class": "fast"}), 409)
    await create(other, v["name"])                       # names are the tenant's own
    assert (await client.delete(f"/v1/volumes/{v['id']}")).status == 202
    assert_problem(await client.post("/v1/volumes", {"name": v["name"], "size_bytes": GiB}), 409)   # still deleting
    await storage_says(api, nc, v, 3, "deleted")
    again = await create(client, v["name"])
    await storage_says(api, nc, again, 2, "rejected", reason="quota storage:standard:bytes exceeded")
    got = await shown(client, again["id"], lambda b: b["state"] == "rejected")
    assert got["reason"] == "quota storage:standard:bytes exceeded"
    await create(client, v["name"])
    assert await volumes_sent(api, tenant_id) == 3


async def test_the_list_pages_newest_first_and_leaves_deleted_volumes_out(api, nc, classes):
    client, _ = await api.tenant_user()
    made = [(await create(client, f"page-{i}"))["id"] for i in range(5)]
    gone = await available(api, nc, client)
    assert (await client.delete(f"/v1/volumes/{gone['id']}")).status == 202
    await storage_says(api, nc, gone, 3, "deleted")
    assert_problem(await client.get(f"/v1/volumes/{gone['id']}"), 404)
    seen, cursor = [], None
    while True:
        r = await client.get("/v1/volumes?limit=2" + (f"&cursor={cursor}" if cursor else ""))
        assert r.status == 200 and len(r.body["items"]) <= 2
        seen += [i["id"] for i in r.body["items"]]
        cursor = r.body["next_cursor"]
        if cursor is None:
            break
    assert seen == made[::-1]
    for query in ("limit=0", "limit=101", "cursor=nope", "limit=x"):
        assert_problem(await client.get(f"/v1/volumes?{query}"), 422)


async def test_a_volume_only_grows_and_shows_the_requested_size_until_the_service_applied_it(api, nc, watch, classes):
    client, tenant_id = await api.tenant_user()
    commands = await watch("storage.cmd.resize_volume")
    v = await create(client, size=4 * GiB)
    path = f"/v1/volumes/{v['id']}"
    assert_problem(await client.call("PATCH", path, json_body={"size_bytes": 8 * GiB}), 409)    # still creating
    await storage_says(api, nc, v, 2, "available")
    for size in (4 * GiB, 2 * GiB, 0, -1, STANDARD_MAX + 1):
        assert_problem(await client.call("PATCH", path, json_body={"size_bytes": size}), 422, "size_bytes")
    for body in ({"size_bytes": 8 * GiB, "name": "other"}, {}, {"size_bytes": "8"}):
        assert_problem(await client.call("PATCH", path, json_body=body), 422)
    r = await client.call("PATCH", path, json_body={"size_bytes": 8 * GiB})
    assert r.status == 202 and (r.body["size_bytes"], r.body["requested_size_bytes"]) == (4 * GiB, 8 * GiB)
    [(_, env, _)] = await commands.wait_for(lambda i: i[1]["data"]["volume_id"] == v["id"])
    assert {k: v_ for k, v_ in env["data"].items() if k != "request_id"} == {
        "volume_id": v["id"], "tenant_id": tenant_id, "size_bytes": 8 * GiB}
    uuid.UUID(env["data"]["request_id"])
    await storage_says(api, nc, v, 3, "available", size_bytes=8 * GiB)
    got = await shown(client, v["id"], lambda b: b["size_bytes"] == 8 * GiB)
    assert got["requested_size_bytes"] is None
    assert await volumes_sent(api, tenant_id, "storage.resize_volume") == 1


async def test_delete_waits_for_attachments_and_live_allocations_then_is_deleting_and_the_volume_goes(api, nc, classes):
    client, tenant_id = await api.tenant_user()
    v = await create(client)
    path = f"/v1/volumes/{v['id']}"
    assert_problem(await client.delete(path), 409)                                        # still creating
    alloc = str(uuid.uuid4())
    attached = [{"allocation_id": alloc, "mode": "rw", "node_id": str(uuid.uuid4()), "state": "attached"}]
    await storage_says(api, nc, v, 2, "in-use", attachments=attached)
    problem = assert_problem(await client.delete(path), 409)
    assert problem["type"].endswith("/volume-in-use") and alloc in problem["detail"]
    await storage_says(api, nc, v, 3, "available")
    r = await client.post("/v1/allocations", {"name": "mounts", "shape": "vm.1gpu", "volumes": [{"volume_id": v["id"]}]})
    assert r.status == 202, r.body
    assert r.body["id"] in assert_problem(await client.delete(path), 409)["detail"]      # requested, not ended
    await project(api, nc, "allocation.failed", {"allocation_id": r.body["id"], "tenant_id": tenant_id, "state": "FAILED",
                                                 "at": "2030-01-01T00:00:00Z", "failed_step": "reserve_slots",
                                                 "reason": "no capacity"}, tenant_id)
    deleting = await client.delete(path)
    assert deleting.status == 202 and deleting.body["state"] == "deleting"
    assert (await client.delete(path)).status == 202                                      # again: nothing more sent
    assert await outbox_count(api, "storage.destroy_volume", "volume_id", v["id"]) == 1
    await storage_says(api, nc, v, 4, "deleted")
    await shown(client, v["id"], lambda b: b.get("status") == 404)
    assert (await client.get("/v1/volumes")).body["items"] == []
    assert_problem(await client.delete(path), 404)


async def test_a_rejected_volume_shows_its_reason_and_deleting_it_sends_nothing(api, nc, classes):
    client, tenant_id = await api.tenant_user()
    v = await create(client)
    await storage_says(api, nc, v, 1, "rejected", reason="backend: no space left on the storage host")
    got = await shown(client, v["id"], lambda b: b["state"] == "rejected")
    assert got["reason"] == "backend: no space left on the storage host"
    gone = await client.delete(f"/v1/volumes/{v['id']}")
    assert gone.status == 202 and gone.body["state"] == "deleted"
    assert_problem(await client.get(f"/v1/volumes/{v['id']}"), 404)
    assert await volumes_sent(api, tenant_id, "storage.destroy_volume") == 0


async def test_provider_admins_have_no_volumes_and_anonymous_callers_are_401(api, classes):
    admin = await api.admin()
    for method, body in (("GET", None), ("POST", {"name": "x", "size_bytes": GiB})):
        assert_problem(await admin.call(method, "/v1/volumes", json_body=body), 403)
        assert_problem(await api.anonymous().call(method, "/v1/volumes", json_body=body), 401)
