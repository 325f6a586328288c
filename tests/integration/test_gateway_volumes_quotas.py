"""Storage quotas through the gateway: provider admins set a tenant's quota in a class, tenant admins split it,
members read theirs with its use; a volume (or its growth, or an allocation's scratch volume) over a quota is a
403 quota-exceeded that creates and sends nothing, however many requests race for the last bytes."""
from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from services.storage.contracts import GB
from shared.contract import load_catalog
from tests.integration.test_gateway_volumes import CLASSES, GiB, announce_classes, available, create, storage_says
from tests.support.bus import make_envelope, publish_envelope
from tests.support.gateway import PROJECTED_WITHIN_S, assert_problem, outbox_count, project
from tests.support.polling import eventually


@pytest.fixture
async def classes(api, nc) -> dict:
    return await announce_classes(api, nc)


async def set_quota(api, nc, tenant_id: str, storage_class: str, version: int, *, max_bytes: int | None = None,
                    max_volumes: int | None = None, user_id: str | None = None) -> None:
    """Play the storage service: a quota it applied (storage.quota_changed)."""
    await project(api, nc, "storage.quota_changed", {
        "tenant_id": tenant_id, "storage_class": storage_class, "user_id": user_id, "max_bytes": max_bytes,
        "max_volumes": max_volumes, "effective_max_bytes": max_bytes if max_bytes is not None else 1 << 60,
        "effective_max_volumes": max_volumes if max_volumes is not None else 1_000_000, "version": version}, tenant_id)


async def user_of(api, tenant_id: str) -> str:
    return str(await api.scalar("SELECT id FROM users WHERE tenant_id=$1 ORDER BY created_at LIMIT 1",
                                uuid.UUID(tenant_id)))


async def test_a_volume_over_the_tenants_quota_is_403_with_its_members_and_creates_nothing(api, nc, classes):
    client, tenant_id = await api.tenant_user()
    await set_quota(api, nc, tenant_id, "standard", 1, max_bytes=10 * GiB, max_volumes=2)
    await create(client, size=6 * GiB)
    r = await client.post("/v1/volumes", {"name": "big", "size_bytes": 5 * GiB})
    problem = assert_problem(r, 403)
    assert problem["type"].endswith("/quota-exceeded")
    assert (problem["quota"], problem["limit"], problem["used"], problem["requested"]) == (
        "storage:standard:bytes", 10 * GiB, 6 * GiB, 5 * GiB)
    await create(client, size=GiB)
    problem = assert_problem(await client.post("/v1/volumes", {"name": "third", "size_bytes": GiB}), 403)
    assert (problem["quota"], problem["limit"], problem["used"], problem["requested"]) == (
        "storage:standard:volumes", 2, 2, 1)
    await create(client, size=GiB, storage_class="fast")           # another class: its own quota (the default)
    assert await api.commands_of("storage.create_volume", tenant_id) == 3
    assert await api.scalar("SELECT count(*) FROM volumes_view WHERE tenant_id=$1", uuid.UUID(tenant_id)) == 3


async def test_a_users_share_refuses_what_the_tenant_quota_would_admit_and_growth_is_charged_its_delta(api, nc,
                                                                                                     classes):
    client, tenant_id = await api.tenant_user()
    user_id = await user_of(api, tenant_id)
    await set_quota(api, nc, tenant_id, "standard", 1, max_bytes=100 * GiB)
    await set_quota(api, nc, tenant_id, "standard", 1, max_bytes=4 * GiB, user_id=user_id)
    v = await available(api, nc, client, size=3 * GiB)
    problem = assert_problem(await client.post("/v1/volumes", {"name": "more", "size_bytes": 2 * GiB}), 403)
    assert (problem["quota"], problem["limit"], problem["used"], problem["requested"]) == (
        "storage:standard:user:bytes", 4 * GiB, 3 * GiB, 2 * GiB)
    grow = await client.call("PATCH", f"/v1/volumes/{v['id']}", json_body={"size_bytes": 5 * GiB})
    problem = assert_problem(grow, 403)
    assert (problem["quota"], problem["used"], problem["requested"]) == ("storage:standard:user:bytes", 3 * GiB, 2 * GiB)
    assert (await client.call("PATCH", f"/v1/volumes/{v['id']}", json_body={"size_bytes": 4 * GiB})).status == 202
    # the pending growth is held: nothing is left for another volume
    problem = assert_problem(await client.post("/v1/volumes", {"name": "tiny", "size_bytes": 1 << 20}), 403)
    assert problem["used"] == 4 * GiB
    assert await api.commands_of("storage.resize_volume", tenant_id) == 1


async def test_concurrent_creates_across_the_quota_boundary_never_exceed_it(api, nc, classes):
    """Many callers of one tenant, each request on a connection and a transaction of its own."""
    tenant_id = await api.new_tenant()
    clients = [(await api.new_user(tenant_id))[0] for _ in range(3)]
    await set_quota(api, nc, tenant_id, "standard", 1, max_bytes=5 * GiB, max_volumes=100)
    bodies = [(clients[i % 3], {"name": f"race-{i}", "size_bytes": GiB}) for i in range(24)]
    answers = await asyncio.gather(*(c.post("/v1/volumes", b) for c, b in bodies))
    assert sorted(r.status for r in answers).count(202) == 5
    assert {r.status for r in answers} == {202, 403}
    for r in (r for r in answers if r.status == 403):
        assert r.body["quota"] == "storage:standard:bytes" and r.body["used"] + GiB > 5 * GiB
    assert await api.commands_of("storage.create_volume", tenant_id) == 5
    held = await api.scalar("SELECT sum(size_bytes) FROM volumes_view WHERE tenant_id=$1", uuid.UUID(tenant_id))
    assert held == 5 * GiB


async def test_concurrent_growth_across_the_quota_boundary_never_exceeds_it(api, nc, classes):
    client, tenant_id = await api.tenant_user()
    await set_quota(api, nc, tenant_id, "standard", 1, max_bytes=6 * GiB)
    volumes = [await available(api, nc, client, size=GiB) for _ in range(3)]          # 3 GiB held, 3 free
    answers = await asyncio.gather(*(client.call("PATCH", f"/v1/volumes/{v['id']}", json_body={"size_bytes": 3 * GiB})
                                     for v in volumes))
    assert sorted(r.status for r in answers) == [202, 403, 403]                     # only one 2 GiB growth fits
    assert await api.commands_of("storage.resize_volume", tenant_id) == 1


async def test_provider_admin_sets_a_tenants_storage_quota_and_bad_requests_send_nothing(api, watch, classes):
    admin, (member, _) = await api.admin(), await api.tenant_user("tenant_admin")
    tenant_id = await api.new_tenant()
    commands = await watch("storage.cmd.set_quota")
    path = f"/v1/tenants/{tenant_id}/storage-quotas/standard"
    r = await admin.call("PUT", path, json_body={"max_bytes": 50 * GiB, "max_volumes": 10})
    assert r.status == 202 and (r.body["max_bytes"], r.body["max_volumes"], r.body["user_id"]) == (50 * GiB, 10, None)
    [(_, env, _)] = await commands.wait_for(lambda i: i[1]["data"]["tenant_id"] == tenant_id)
    admin_id = str(await api.scalar("SELECT id FROM users WHERE tenant_id IS NULL AND role='provider_admin' LIMIT 1"))
    assert env["data"] == {"tenant_id": tenant_id, "storage_class": "standard", "user_id": None,
                           "max_bytes": 50 * GiB, "max_volumes": 10, "set_by": admin_id}
    cases = [(admin, path, {"max_bytes": -1}, 422), (admin, path, {"max_bytes": "5"}, 422),
             (admin, path, {"max_volumes": 1_000_001}, 422), (admin, path, {"max_bytes": 1, "used_bytes": 0}, 422),
             (admin, f"/v1/tenants/{tenant_id}/storage-quotas/Gold", {"max_bytes": 1}, 422),
             (admin, f"/v1/tenants/{tenant_id}/storage-quotas/gold", {"max_bytes": 1}, 404),
             (admin, f"/v1/tenants/{uuid.uuid4()}/storage-quotas/standard", {"max_bytes": 1}, 404),
             (member, path, {"max_bytes": 1}, 403), (api.anonymous(), path, {"max_bytes": 1}, 401)]
    for client, where, body, status in cases:
        assert_problem(await client.call("PUT", where, json_body=body), status)
    assert await outbox_count(api, "storage.set_quota", "tenant_id", tenant_id) == 1


async def test_a_tenant_admin_splits_the_storage_quota_for_its_own_users_within_the_tenants_limit(api, nc, watch,
                                                                                                 classes):
    tadmin, tenant_id = await api.tenant_user("tenant_admin")
    plain_user, user = await api.new_user(tenant_id)
    outsider_admin, other_tenant = await api.tenant_user("tenant_admin")
    _, stranger = await api.new_user(other_tenant)
    await set_quota(api, nc, tenant_id, "standard", 1, max_bytes=8 * GiB, max_volumes=4)
    commands = await watch("storage.cmd.set_quota")
    path = f"/v1/tenants/{tenant_id}/users/{user['id']}/storage-quotas/standard"
    r = await tadmin.call("PUT", path, json_body={"max_bytes": 2 * GiB})
    assert r.status == 202 and (r.body["user_id"], r.body["max_bytes"], r.body["max_volumes"]) == (user["id"], 2 * GiB,
                                                                                                 None)
    [(_, env, _)] = await commands.wait_for(lambda i: i[1]["data"]["tenant_id"] == tenant_id)
    assert (env["data"]["user_id"], env["data"]["max_bytes"], env["data"]["storage_class"]) == (user["id"], 2 * GiB,
                                                                                              "standard")
    over = assert_problem(await tadmin.call("PUT", path, json_body={"max_bytes": 9 * GiB, "max_volumes": 5}), 422)
    assert {e["field"] for e in over["errors"]} == {"max_bytes", "max_volumes"}
    cases = [(tadmin, f"/v1/tenants/{tenant_id}/users/{stranger['id']}/storage-quotas/standard", 404),
             (tadmin, f"/v1/tenants/{tenant_id}/users/{user['id']}/storage-quotas/gold", 404),
             (plain_user, path, 403), (outsider_admin, path, 404)]
    for client, where, status in cases:
        assert_problem(await client.call("PUT", where, json_body={"max_bytes": GiB}), status)
    assert (await (await api.admin()).call("PUT", path, json_body={"max_volumes": 1})).status == 202
    assert await outbox_count(api, "storage.set_quota", "tenant_id", tenant_id) == 2


async def test_members_read_their_storage_quotas_with_use_usage_and_shares_and_another_tenant_gets_404(api, nc,
                                                                                                      classes):
    member, tenant_id = await api.tenant_user()
    user_id = await user_of(api, tenant_id)
    outsider, _ = await api.tenant_user("tenant_admin")
    await set_quota(api, nc, tenant_id, "standard", 2, max_bytes=20 * GiB, max_volumes=5)
    await set_quota(api, nc, tenant_id, "standard", 1, max_bytes=GiB, max_volumes=1)        # older: ignored
    await set_quota(api, nc, tenant_id, "standard", 1, max_bytes=10 * GiB, user_id=user_id)
    a, b = await available(api, nc, member, size=2 * GiB), await available(api, nc, member, size=3 * GiB)
    await create(member, size=GiB, storage_class="fast")
    await project(api, nc, "storage.usage_reported", {"tenant_id": tenant_id, "at": datetime.now(UTC), "volumes": [
        {"volume_id": a["id"], "used_bytes": 1000, "limit_bytes": 2 * GiB},
        {"volume_id": b["id"], "used_bytes": 234, "limit_bytes": 3 * GiB}]}, tenant_id)
    r = await member.get(f"/v1/tenants/{tenant_id}/storage-quotas")
    assert r.status == 200
    by_class = {q["storage_class"]: q for q in r.body["items"]}
    assert list(by_class) == ["fast", "standard"]
    std = by_class["standard"]
    assert (std["max_bytes"], std["max_volumes"], std["quota_set"], std["version"]) == (20 * GiB, 5, True, 2)
    assert (std["provisioned_bytes"], std["volumes"], std["used_bytes"]) == (5 * GiB, 2, 1234)
    assert [(u["user_id"], u["max_bytes"], u["provisioned_bytes"], u["volumes"]) for u in std["users"]] == [
        (user_id, 10 * GiB, 5 * GiB, 2)]
    fast = by_class["fast"]
    assert (fast["max_bytes"], fast["max_volumes"], fast["quota_set"], fast["volumes"], fast["provisioned_bytes"]) == (
        CLASSES["default_quota_bytes"], CLASSES["default_quota_volumes"], False, 1, GiB)
    assert (await member.get(f"/v1/volumes/{a['id']}")).body["used_bytes"] == 1000
    assert_problem(await outsider.get(f"/v1/tenants/{tenant_id}/storage-quotas"), 404)
    assert (await (await api.admin()).get(f"/v1/tenants/{tenant_id}/storage-quotas")).status == 200
    assert_problem(await (await api.admin()).get(f"/v1/tenants/{uuid.uuid4()}/storage-quotas"), 404)


async def test_every_caller_reads_the_latest_announced_storage_classes(api, nc, classes):
    member, _ = await api.tenant_user()
    for client in (member, await api.admin()):
        r = await client.get("/v1/storage-classes")
        assert r.status == 200
        assert [(c["name"], c["backend"], c["max_volume_bytes"], c["default"]) for c in r.body["items"]] == [
            ("standard", "btrfs", 1 << 40, True), ("fast", "weka", 64 * GiB, False)]
        assert r.body["default_quota_bytes"] == CLASSES["default_quota_bytes"]
    assert_problem(await api.anonymous().get("/v1/storage-classes"), 401)
    # an announcement made before the one shown (delivered late) changes nothing
    stale = make_envelope("storage.classes_announced", {**CLASSES, "classes": CLASSES["classes"][:1]})
    stale = stale.model_copy(update={"occurred_at": stale.occurred_at - timedelta(hours=1)})
    await publish_envelope(nc.jetstream(), load_catalog().message("storage.classes_announced").subject, stale)
    await eventually(lambda: api.handled(stale), timeout=PROJECTED_WITHIN_S)
    assert len((await member.get("/v1/storage-classes")).body["items"]) == 2


async def test_an_allocations_scratch_volume_is_charged_to_its_class_and_an_unknown_class_is_a_422(api, nc, classes):
    client, tenant_id = await api.tenant_user()
    await set_quota(api, nc, tenant_id, "standard", 1, max_bytes=100 * GB)
    await set_quota(api, nc, tenant_id, "fast", 1, max_bytes=10 * GB)
    v = await create(client, size=60 * GB)
    await storage_says(api, nc, v, 2, "available")
    problem = assert_problem(await client.post("/v1/allocations", {"name": "s", "shape": "vm.1gpu", "volume_gb": 50}), 403)
    assert (problem["quota"], problem["limit"], problem["used"], problem["requested"]) == (
        "storage:standard:bytes", 100 * GB, 60 * GB, 50 * GB)
    assert_problem(await client.post("/v1/allocations", {"name": "s", "shape": "vm.1gpu", "volume_gb": 11,
                                                         "scratch_class": "fast"}), 403)
    bad = assert_problem(await client.post("/v1/allocations", {"name": "s", "shape": "vm.1gpu", "scratch_class": "gold"}),
                         422, "scratch_class")
    assert "standard" in bad["errors"][0]["message"]
    ok = await client.post("/v1/allocations", {"name": "s", "shape": "vm.1gpu", "volume_gb": 10, "scratch_class": "fast"})
    assert ok.status == 202 and ok.body["scratch_class"] == "fast"
    assert await api.commands_of("allocation.request", tenant_id) == 1
