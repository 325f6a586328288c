"""Quotas through the gateway: provider admins set them, tenant admins split them, members read theirs, and a
POST /v1/allocations the quota view proves over quota is a 403 quota-exceeded that creates and sends nothing."""
from __future__ import annotations

import json
import uuid

from tests.support.gateway import node_doc, outbox_count, project


def quota(tenant_id: str, pool: str, limit: int, used: int, version: int, *, model: str = "H100",
          user_id: str | None = None, guaranteed: int = 0) -> dict:
    return {"tenant_id": tenant_id, "gpu_model": model, "pool": pool, "user_id": user_id, "limit": limit,
            "guaranteed": guaranteed, "used": used, "version": version}


async def pool_with_nodes(api, nc, *models: str) -> str:
    """A fresh pool holding one node of each GPU model (as the scheduler published them)."""
    pool = f"pool-{uuid.uuid4().hex[:8]}"
    for model in models:
        await project(api, nc, "scheduler.node_changed", node_doc(str(uuid.uuid4()), f"n-{uuid.uuid4().hex[:8]}", 1,
                                                                  pool=pool, gpu_model=model, status="schedulable"))
    return pool


async def allocations_of(api, tenant_id: str) -> tuple[int, int]:
    rows = await api.scalar("SELECT count(*) FROM allocations_view WHERE tenant_id=$1", uuid.UUID(tenant_id))
    return rows, await api.commands_of("allocation.request", tenant_id)


async def test_provider_admin_sets_a_tenant_quota_and_bad_requests_send_nothing(api, watch):
    admin, (member, _) = await api.admin(), await api.tenant_user("tenant_admin")
    tenant_id = await api.new_tenant()
    commands = await watch("scheduler.cmd.set_quota")
    path = f"/v1/tenants/{tenant_id}/quotas/shared/H100"
    r = await admin.call("PUT", path, json_body={"limit": 16, "guaranteed": 4})
    assert r.status == 202 and (r.body["limit"], r.body["guaranteed"], r.body["used"]) == (16, 4, 0)
    hits = await commands.wait_for(lambda i: i[1]["data"]["tenant_id"] == tenant_id)
    sent = hits[0][1]["data"]
    got = (sent["pool"], sent["gpu_model"], sent["limit"], sent["guaranteed"], sent["user_id"])
    assert got == ("shared", "H100", 16, 4, None)
    cases = [(admin, path, {"limit": 2, "guaranteed": 3}, 422), (admin, path, {"limit": -1}, 422),
             (admin, path, {"limit": 2, "used": 0}, 422), (admin, f"/v1/tenants/{tenant_id}/quotas/Bad_Pool/H100",
                                                           {"limit": 1}, 422),
             (admin, f"/v1/tenants/{uuid.uuid4()}/quotas/shared/H100", {"limit": 1}, 404),
             (member, path, {"limit": 100}, 403), (api.anonymous(), path, {"limit": 100}, 401)]
    for client, where, body, status in cases:
        r = await client.call("PUT", where, json_body=body)
        assert r.status == status and r.content_type == "application/problem+json", (where, body, r.body)
    assert await outbox_count(api, "scheduler.set_quota", "tenant_id", tenant_id) == 1


async def test_members_read_their_tenants_quotas_with_user_splits_and_another_tenant_gets_404(api, nc):
    member, tenant_id = await api.tenant_user()
    _, user = await api.new_user(tenant_id)
    outsider, _ = await api.tenant_user("tenant_admin")
    await project(api, nc, "scheduler.quota_changed", quota(tenant_id, "shared", 8, 3, 1, guaranteed=2))
    await project(api, nc, "scheduler.quota_changed", quota(tenant_id, "shared", 2, 1, 1, user_id=user["id"]))
    # an older document arriving late changes nothing
    await project(api, nc, "scheduler.quota_changed", quota(tenant_id, "shared", 8, 5, 3, guaranteed=2))
    await project(api, nc, "scheduler.quota_changed", quota(tenant_id, "shared", 8, 0, 2))
    r = await member.get(f"/v1/tenants/{tenant_id}/quotas")
    assert r.status == 200
    [q] = r.body["items"]
    assert (q["pool"], q["gpu_model"], q["limit"], q["guaranteed"], q["used"], q["version"]) == ("shared", "H100", 8, 2, 5, 3)
    assert [(u["user_id"], u["limit"], u["used"]) for u in q["users"]] == [(user["id"], 2, 1)]
    assert (await outsider.get(f"/v1/tenants/{tenant_id}/quotas")).status == 404
    assert (await (await api.admin()).get(f"/v1/tenants/{tenant_id}/quotas")).status == 200
    assert (await (await api.admin()).get(f"/v1/tenants/{uuid.uuid4()}/quotas")).status == 404


async def test_tenant_admin_splits_the_quota_for_its_own_users_within_the_tenant_limit(api, nc, watch):
    tadmin, tenant_id = await api.tenant_user("tenant_admin")
    plain_user, user = await api.new_user(tenant_id)
    outsider_admin, other_tenant = await api.tenant_user("tenant_admin")
    _, stranger = await api.new_user(other_tenant)
    await project(api, nc, "scheduler.quota_changed", quota(tenant_id, "shared", 8, 0, 1))
    commands = await watch("scheduler.cmd.set_quota")
    path = f"/v1/tenants/{tenant_id}/users/{user['id']}/quotas/shared/H100"
    r = await tadmin.call("PUT", path, json_body={"limit": 4})
    assert r.status == 202 and (r.body["user_id"], r.body["limit"]) == (user["id"], 4)
    hits = await commands.wait_for(lambda i: i[1]["data"]["tenant_id"] == tenant_id)
    assert (hits[0][1]["data"]["user_id"], hits[0][1]["data"]["limit"]) == (user["id"], 4)
    cases = [(tadmin, path, {"limit": 9}, 422),                      # above the tenant's own limit
             (tadmin, path, {"limit": 1, "guaranteed": 1}, 422),
             (tadmin, f"/v1/tenants/{tenant_id}/users/{stranger['id']}/quotas/shared/H100", {"limit": 1}, 404),
             (plain_user, path, {"limit": 1}, 403), (outsider_admin, path, {"limit": 1}, 404)]
    for client, where, body, status in cases:
        r = await client.call("PUT", where, json_body=body)
        assert r.status == status and r.content_type == "application/problem+json", (where, body, r.body)
    assert await outbox_count(api, "scheduler.set_quota", "tenant_id", tenant_id) == 1


async def test_a_request_over_the_tenants_quota_is_403_with_its_members_and_creates_nothing(api, nc, watch):
    client, tenant_id = await api.tenant_user()
    pool = await pool_with_nodes(api, nc, "H100")
    await project(api, nc, "scheduler.quota_changed", quota(tenant_id, pool, 4, 3, 1))
    commands = await watch("allocation.cmd.request")
    r = await client.post("/v1/allocations", {"name": "big", "shape": "vm.2gpu", "pool": pool},
                          headers={"Idempotency-Key": f"k-{uuid.uuid4()}"})
    assert r.status == 403 and r.content_type == "application/problem+json"
    assert r.body["type"].endswith("/quota-exceeded")
    assert (r.body["quota"], r.body["limit"], r.body["used"], r.body["requested"]) == (
        f"tenant {tenant_id} H100 in pool {pool}", 4, 3, 2)
    assert await allocations_of(api, tenant_id) == (0, 0)
    assert await api.scalar("SELECT count(*) FROM idempotency_keys WHERE tenant_id=$1", uuid.UUID(tenant_id)) == 0
    ok = await client.post("/v1/allocations", {"name": "fits", "shape": "vm.1gpu", "pool": pool})
    assert ok.status == 202
    hits = await commands.wait_for(lambda i: i[1]["tenant_id"] == tenant_id)
    assert [h[1]["data"]["allocation_id"] for h in hits] == [ok.body["id"]]


async def test_a_users_split_refuses_what_the_tenant_quota_would_admit(api, nc):
    client, tenant_id = await api.tenant_user()
    pool = await pool_with_nodes(api, nc, "H100")
    user_id = await api.scalar("SELECT id FROM users WHERE tenant_id=$1", uuid.UUID(tenant_id))
    await project(api, nc, "scheduler.quota_changed", quota(tenant_id, pool, 8, 0, 1))
    await project(api, nc, "scheduler.quota_changed", quota(tenant_id, pool, 1, 1, 1, user_id=str(user_id)))
    r = await client.post("/v1/allocations", {"name": "mine", "shape": "vm.1gpu", "pool": pool})
    assert r.status == 403 and r.body["quota"].endswith(f"for user {user_id}") and r.body["limit"] == 1
    assert await allocations_of(api, tenant_id) == (0, 0)


async def test_a_shape_for_any_model_is_refused_only_when_every_model_of_the_pool_is_over_quota(api, nc):
    client, tenant_id = await api.tenant_user()
    pool = await pool_with_nodes(api, nc, "H100", "A100")
    await project(api, nc, "scheduler.quota_changed", quota(tenant_id, pool, 2, 2, 1))
    # A100 has no quota (not limited): the scheduler may place it there
    assert (await client.post("/v1/allocations", {"name": "any", "shape": "vm.2gpu", "pool": pool})).status == 202
    await project(api, nc, "scheduler.quota_changed", quota(tenant_id, pool, 4, 3, 1, model="A100"))
    r = await client.post("/v1/allocations", {"name": "none", "shape": "vm.2gpu", "pool": pool})
    assert r.status == 403 and r.body["quota"] == f"tenant {tenant_id} A100 in pool {pool}"   # first by model name
    # a pool whose models are unknown is left to the scheduler
    await project(api, nc, "scheduler.quota_changed", quota(tenant_id, "empty-pool", 0, 0, 1))
    assert (await client.post("/v1/allocations", {"name": "unknown", "shape": "vm.1gpu", "pool": "empty-pool"})).status == 202


async def test_many_quotas_use_in_one_message_each_under_its_own_version_guard(api, nc):
    """``scheduler.quota_use_changed`` carries many quotas' documents: each is applied only when newer than its
    row (a late one changes nothing), a quota given twice keeps its newest, and the refusal reads the new use."""
    client, tenant_id = await api.tenant_user()
    _, other = await api.tenant_user()
    pool = await pool_with_nodes(api, nc, "H100")
    await project(api, nc, "scheduler.quota_changed", quota(tenant_id, pool, 4, 0, 5))
    await project(api, nc, "scheduler.quota_use_changed", {"quotas": [
        quota(tenant_id, pool, 4, 1, 4),                                    # older than the row: ignored
        quota(other, pool, 8, 6, 2), quota(other, pool, 8, 7, 3),           # twice: the newest wins
        quota(tenant_id, pool, 4, 3, 6, model="A100")]})
    rows = {(str(r["tenant_id"]), r["gpu_model"]): (r["used"], r["version"]) for r in json.loads(await api.scalar(
        "SELECT json_agg(q) FROM quotas_view q WHERE pool=$1", pool))}
    assert rows == {(tenant_id, "H100"): (0, 5), (other, "H100"): (7, 3), (tenant_id, "A100"): (3, 6)}
    await project(api, nc, "scheduler.quota_use_changed", {"quotas": [quota(tenant_id, pool, 4, 3, 6)]})
    r = await client.post("/v1/allocations", {"name": "big", "shape": "vm.2gpu", "pool": pool})
    assert r.status == 403 and (r.body["limit"], r.body["used"]) == (4, 3)

