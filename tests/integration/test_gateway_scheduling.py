"""Inventory administration through the gateway: node documents and slot-map approval, node changes and
cordon, pools, shapes (the scheduler is played by publishing its events; its commands are watched)."""
from __future__ import annotations

import uuid

from tests.support.gateway import (
    DEFAULT_SHAPES,
    PROJECTED_WITHIN_S,
    SLOT_MAP,
    ensure_default_shapes,
    node_doc,
    outbox_count,
    project,
    publish,
)
from tests.support.polling import eventually

AT = "2030-01-01T00:00:00Z"


async def node_with_document(api, nc, **over) -> tuple[str, str]:
    """A node the scheduler has published (pending approval of proposal 1 unless overridden)."""
    node_id, name = str(uuid.uuid4()), f"node-{uuid.uuid4().hex[:8]}"
    await project(api, nc, "scheduler.node_changed", node_doc(node_id, name, over.pop("version", 1), **over))
    return node_id, name


# --- nodes -----------------------------------------------------------------------------------------

async def test_node_document_shows_the_proposal_and_approving_it_sends_one_command(api, nc, watch):
    admin = await api.admin()
    commands = await watch("scheduler.cmd.approve_slot_map")
    node_id, name = await node_with_document(api, nc)
    doc = (await admin.get(f"/v1/nodes/{node_id}")).body
    assert doc["status"] == "pending_approval" and doc["proposal"] == 1 and doc["proposed_slot_map"] == SLOT_MAP
    assert (doc["pool"], doc["region"], doc["site"], doc["rack"], doc["version"]) == ("shared", "eu-1", "fra-1", "r12", 1)
    assert name in {n["name"] for n in (await admin.get("/v1/nodes")).body["items"]}
    r = await admin.post(f"/v1/nodes/{node_id}/approve", {"proposal": 1, "wipe_policy": "nvme-format"})
    assert r.status == 202 and r.body["id"] == node_id
    hits = await commands.wait_for(lambda i: i[1]["data"]["node_id"] == node_id)
    assert hits[0][1]["data"]["proposal"] == 1 and hits[0][1]["data"]["wipe_policy"] == "nvme-format"
    assert hits[0][1]["data"]["approved_by"] is not None


async def test_a_node_in_review_after_rediscovery_can_have_its_new_proposal_approved(api, nc, watch):
    admin = await api.admin()
    commands = await watch("scheduler.cmd.approve_slot_map")
    node_id, _ = await node_with_document(api, nc, status="needs_review", proposal=2, approved_slot_map=SLOT_MAP,
                                          review=["GPU 0000:1b:00.0 missing"])
    r = await admin.post(f"/v1/nodes/{node_id}/approve", {"proposal": 2})
    assert r.status == 202, r.body
    hits = await commands.wait_for(lambda i: i[1]["data"]["node_id"] == node_id)
    assert hits[0][1]["data"]["proposal"] == 2


async def test_approving_a_stale_proposal_or_a_node_not_pending_is_409_naming_the_current_one(api, nc):
    admin = await api.admin()
    node_id, name = await node_with_document(api, nc, proposal=2)
    r = await admin.post(f"/v1/nodes/{node_id}/approve", {"proposal": 1})
    assert r.status == 409 and r.content_type == "application/problem+json"
    assert r.body["current_proposal"] == 2 and r.body["node_status"] == "pending_approval"
    await project(api, nc, "scheduler.node_changed", node_doc(node_id, name, 2, status="schedulable", proposal=None,
                                                               approved_slot_map=SLOT_MAP, free_slots=8))
    r = await admin.post(f"/v1/nodes/{node_id}/approve", {"proposal": 2})
    assert r.status == 409 and r.body["node_status"] == "schedulable"
    assert await outbox_count(api, "scheduler.approve_slot_map", "node_id", node_id) == 0


async def test_node_endpoints_refuse_the_unauthenticated_tenants_unknown_nodes_and_bad_bodies(api, nc):
    admin, (user, _) = await api.admin(), await api.tenant_user("tenant_admin")
    node_id, _ = await node_with_document(api, nc)
    assert (await api.anonymous().get(f"/v1/nodes/{node_id}")).status == 401
    assert (await user.get(f"/v1/nodes/{node_id}")).status == 403
    assert (await user.post(f"/v1/nodes/{node_id}/approve", {"proposal": 1})).status == 403
    assert (await user.call("PATCH", f"/v1/nodes/{node_id}", json_body={"cordoned": True})).status == 403
    assert (await user.post(f"/v1/nodes/{node_id}/cordon")).status == 403
    assert (await admin.get(f"/v1/nodes/{uuid.uuid4()}")).status == 404
    assert (await admin.post(f"/v1/nodes/{uuid.uuid4()}/approve", {"proposal": 1})).status == 404
    assert (await admin.post(f"/v1/nodes/{uuid.uuid4()}/uncordon")).status == 404
    for bad in ({"proposal": 0}, {"proposal": "1"}, {"proposal": 1, "approved_by": str(uuid.uuid4())}, {}):
        r = await admin.post(f"/v1/nodes/{node_id}/approve", bad)
        assert r.status == 422 and r.content_type == "application/problem+json", bad
    for bad in ({}, {"reason": "only a reason"}, {"pool": "Not A Pool"}, {"taints": {"gpu": "x:Evict"}},
                {"cordoned": None}, {"status": "schedulable"}):
        r = await admin.call("PATCH", f"/v1/nodes/{node_id}", json_body=bad)
        assert r.status == 422 and r.content_type == "application/problem+json", bad
    for type_ in ("scheduler.approve_slot_map", "scheduler.update_node"):
        assert await outbox_count(api, type_, "node_id", node_id) == 0


async def test_patch_cordon_and_uncordon_send_update_node_with_what_was_asked(api, nc, watch):
    admin = await api.admin()
    commands = await watch("scheduler.cmd.update_node")
    node_id, _ = await node_with_document(api, nc, status="schedulable", proposal=None)
    change = {"pool": "dedicated-a", "labels": {"hw": "hgx", "row": "3"}, "taints": {"tenant": "a:NoSchedule"},
              "reason": "dedicate to tenant a"}
    r = await admin.call("PATCH", f"/v1/nodes/{node_id}", json_body=change)
    assert r.status == 202 and r.body["pool"] == "dedicated-a" and r.body["taints"] == {"tenant": "a:NoSchedule"}
    assert (await admin.post(f"/v1/nodes/{node_id}/cordon")).body["cordoned"] is True
    assert (await admin.post(f"/v1/nodes/{node_id}/uncordon")).body["cordoned"] is False
    hits = await commands.wait_for(lambda i: i[1]["data"]["node_id"] == node_id and i[1]["data"]["cordoned"] is False)
    sent = [i[1]["data"] for i in commands.items if i[1]["data"]["node_id"] == node_id]
    assert [d["cordoned"] for d in sent] == [None, True, False] and hits
    assert {k: sent[0][k] for k in change} == change and sent[1]["pool"] is None
    # the view follows the scheduler's document, not the request
    assert (await admin.get(f"/v1/nodes/{node_id}")).body["pool"] == "shared"


async def test_an_older_node_document_or_a_late_registration_never_overwrites_a_newer_one(api, nc):
    admin = await api.admin()
    node_id, name = await node_with_document(api, nc, status="schedulable", proposal=None, version=3, free_slots=8)
    stale = await publish(nc, "scheduler.node_changed", node_doc(node_id, name, 2, status="needs_review",
                                                                   review=["gpu 3 missing"]))
    late = await publish(nc, "scheduler.node_registered", {"node_id": node_id, "name": name, "gpu_model": "H100",
                                                           "gpu_count": 8})
    await eventually(lambda: api.handled(stale), timeout=PROJECTED_WITHIN_S)
    await eventually(lambda: api.handled(late), timeout=PROJECTED_WITHIN_S)
    doc = (await admin.get(f"/v1/nodes/{node_id}")).body
    assert (doc["status"], doc["version"], doc["review"], doc["free_slots"]) == ("schedulable", 3, [], 8)
    await project(api, nc, "scheduler.node_changed", node_doc(node_id, name, 4, status="needs_review",
                                                               review=["gpu 3 missing"]))
    doc = (await admin.get(f"/v1/nodes/{node_id}")).body
    assert (doc["status"], doc["review"]) == ("needs_review", ["gpu 3 missing"])


async def test_a_rejected_admin_command_is_shown_on_the_node(api, nc):
    admin = await api.admin()
    node_id, _ = await node_with_document(api, nc)
    await project(api, nc, "scheduler.admin_command_rejected", {"command": "scheduler.approve_slot_map",
                                                                "target": node_id, "reason": "slot 3 has no wipe policy"})
    rejection = (await admin.get(f"/v1/nodes/{node_id}")).body["last_rejection"]
    assert rejection["reason"] == "slot 3 has no wipe policy" and rejection["command"] == "scheduler.approve_slot_map"


# --- pools -----------------------------------------------------------------------------------------

async def test_pool_definition_is_sent_and_the_list_shows_the_newest_document(api, nc, watch):
    admin, (user, _) = await api.admin(), await api.tenant_user("tenant_admin")
    commands = await watch("scheduler.cmd.define_pool")
    name = f"pool-{uuid.uuid4().hex[:8]}"
    body = {"policy": "spread", "taints": {"spot": "true:NoSchedule"}, "description": "spot capacity"}
    r = await admin.call("PUT", f"/v1/pools/{name}", json_body=body)
    assert r.status == 202 and r.body == {"name": name, **body, "version": None, "last_rejection": None}
    hits = await commands.wait_for(lambda i: i[1]["data"]["name"] == name)
    assert hits[0][1]["data"] == {"name": name, **body}
    for version, policy in ((2, "spread"), (1, "pack")):
        await project(api, nc, "scheduler.pool_changed", {"name": name, "policy": policy, "taints": {},
                                                          "description": "", "version": version})
    pools = {p["name"]: p for p in (await admin.get("/v1/pools")).body["items"]}
    assert pools[name]["version"] == 2 and pools[name]["policy"] == "spread"
    assert (await user.get("/v1/pools")).status == 403
    assert (await user.call("PUT", f"/v1/pools/{name}", json_body=body)).status == 403
    for path, bad in ((f"/v1/pools/{name}", {"policy": "random"}), ("/v1/pools/Bad_Name", body),
                      (f"/v1/pools/{name}", {"taints": {"k": "no-effect"}}), (f"/v1/pools/{name}", {"version": 3})):
        assert (await admin.call("PUT", path, json_body=bad)).status == 422, (path, bad)
    assert await outbox_count(api, "scheduler.define_pool", "name", name) == 1


# --- shapes ----------------------------------------------------------------------------------------

async def test_shapes_are_listed_to_any_caller_and_defined_or_deleted_by_provider_admins(api, nc, watch):
    await ensure_default_shapes(api, nc)
    admin, (user, _) = await api.admin(), await api.tenant_user()
    commands = await watch("scheduler.cmd.define_shape")
    name = f"mig-{uuid.uuid4().hex[:8]}"
    body = {"kind": "mig", "gpu_count": 1, "gpu_model": "H100", "mig_profile": "1g.10gb"}
    r = await admin.call("PUT", f"/v1/shapes/{name}", json_body=body)
    assert r.status == 202 and r.body["name"] == name and r.body["deleted"] is False
    hits = await commands.wait_for(lambda i: i[1]["data"]["name"] == name)
    assert hits[0][1]["data"] == {"name": name, **body, "deleted": False}
    await project(api, nc, "scheduler.shape_changed", {"name": name, **body, "version": 1})
    listed = {s["name"]: s for s in (await user.get("/v1/shapes")).body["items"]}
    assert set(DEFAULT_SHAPES) <= set(listed) and listed[name]["mig_profile"] == "1g.10gb"
    assert (await api.anonymous().get("/v1/shapes")).status == 401
    assert (await user.call("PUT", f"/v1/shapes/{name}", json_body=body)).status == 403
    assert (await user.delete(f"/v1/shapes/{name}")).status == 403
    r = await admin.delete(f"/v1/shapes/{name}")
    assert r.status == 202 and r.body["deleted"] is True
    hits = await commands.wait_for(lambda i: i[1]["data"]["name"] == name and i[1]["data"]["deleted"])
    assert hits[0][1]["data"]["mig_profile"] == "1g.10gb"
    assert (await admin.delete(f"/v1/shapes/nothing-{uuid.uuid4().hex[:8]}")).status == 404


async def test_a_shape_that_live_allocations_use_is_409_naming_them_and_deletable_once_they_end(api, nc, watch):
    await ensure_default_shapes(api, nc)
    admin, (user, tenant_id) = await api.admin(), await api.tenant_user()
    commands = await watch("scheduler.cmd.define_shape")
    name = f"used-{uuid.uuid4().hex[:8]}"
    await project(api, nc, "scheduler.shape_changed", {"name": name, "kind": "vm", "gpu_count": 1, "version": 1})
    allocs = [(await user.post("/v1/allocations", {"name": f"a{i}", "shape": name})).body for i in range(2)]
    r = await admin.delete(f"/v1/shapes/{name}")
    assert r.status == 409 and r.content_type == "application/problem+json"
    assert r.body["type"].endswith("/shape-in-use") and r.body["allocations"] == 2 and "2 allocation(s)" in r.body["detail"]
    assert await outbox_count(api, "scheduler.define_shape", "name", name) == 0

    one, other = allocs
    await project(api, nc, "allocation.failed", {"allocation_id": one["id"], "tenant_id": tenant_id, "state": "FAILED",
                                                 "at": AT, "failed_step": "reserve_slots", "reason": "no capacity"},
                  tenant_id)
    assert (await admin.delete(f"/v1/shapes/{name}")).body["allocations"] == 1
    saga = uuid.uuid4()
    await project(api, nc, "allocation.activated", {"allocation_id": other["id"], "tenant_id": tenant_id, "state": "ACTIVE",
                                                    "at": AT, "saga_id": saga, "step": "activate",
                                                    "idempotency_key": f"{saga}:activate", "node_id": uuid.uuid4()},
                  tenant_id)
    assert (await admin.delete(f"/v1/shapes/{name}")).body["allocations"] == 1        # ACTIVE: still in use
    await project(api, nc, "allocation.released", {"allocation_id": other["id"], "tenant_id": tenant_id,
                                                   "state": "RELEASED", "at": AT, "saga_id": saga,
                                                   "step": "mark_released", "idempotency_key": f"{saga}:mark_released"},
                  tenant_id)
    r = await admin.delete(f"/v1/shapes/{name}")
    assert r.status == 202 and r.body["deleted"] is True
    hits = await commands.wait_for(lambda i: i[1]["data"]["name"] == name and i[1]["data"]["deleted"])
    assert len(hits) == 1 and await outbox_count(api, "scheduler.define_shape", "name", name) == 1
    # the scheduler, when allocations came in between, refuses: shown on the shape while it stays listed
    await project(api, nc, "scheduler.admin_command_rejected", {
        "command": "scheduler.define_shape", "target": name, "target_kind": "shape",
        "reason": f"shape {name!r} is in use by 1 allocation(s) (placed or queued); delete it once they are released"})
    listed = {s["name"]: s for s in (await user.get("/v1/shapes")).body["items"]}
    assert "in use by 1 allocation(s)" in listed[name]["last_rejection"]["reason"]


async def test_invalid_shape_definitions_are_422_and_send_nothing(api):
    admin = await api.admin()
    name = f"bad-{uuid.uuid4().hex[:8]}"
    for bad in ({"kind": "mig", "gpu_count": 1}, {"kind": "vm", "gpu_count": 3}, {"kind": "vm", "gpu_count": 2,
                "mig_profile": "1g.10gb"}, {"kind": "gpu", "gpu_count": 1}, {"kind": "vm", "gpu_count": 17},
                {"kind": "vm", "gpu_count": 1, "deleted": True}):
        r = await admin.call("PUT", f"/v1/shapes/{name}", json_body=bad)
        assert r.status == 422 and r.content_type == "application/problem+json", bad
    assert (await admin.call("PUT", "/v1/shapes/UPPER", json_body={"kind": "vm", "gpu_count": 1})).status == 422
    assert await outbox_count(api, "scheduler.define_shape", "name", name) == 0


async def test_every_inventory_endpoint_needs_a_token_and_unknown_nodes_are_404(api):
    anonymous, admin = api.anonymous(), await api.admin()
    node, tenant, user = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    calls = [("GET", f"/v1/nodes/{node}"), ("POST", f"/v1/nodes/{node}/approve"), ("PATCH", f"/v1/nodes/{node}"),
             ("POST", f"/v1/nodes/{node}/cordon"), ("POST", f"/v1/nodes/{node}/uncordon"), ("GET", "/v1/pools"),
             ("PUT", "/v1/pools/p1"), ("GET", "/v1/shapes"), ("PUT", "/v1/shapes/s1"), ("DELETE", "/v1/shapes/s1"),
             ("GET", f"/v1/tenants/{tenant}/quotas"), ("PUT", f"/v1/tenants/{tenant}/quotas/shared/H100"),
             ("PUT", f"/v1/tenants/{tenant}/users/{user}/quotas/shared/H100")]
    for method, path in calls:
        r = await anonymous.call(method, path, json_body={"limit": 1})
        assert r.status == 401 and r.content_type == "application/problem+json", (method, path)
    r = await admin.call("PATCH", f"/v1/nodes/{node}", json_body={"cordoned": True})
    assert r.status == 404 and r.content_type == "application/problem+json"
    assert (await admin.get("/v1/nodes/not-a-uuid")).status == 404
    assert await outbox_count(api, "scheduler.update_node", "node_id", str(node)) == 0


async def test_node_registration_passes_its_location_and_pool_to_the_scheduler(api, watch):
    admin = await api.admin()
    commands = await watch("scheduler.cmd.register_node")
    name = f"node-{uuid.uuid4().hex[:8]}"
    where = {"pool": "gpu-a", "region": "eu-1", "site": "fra-1", "rack": "r07"}
    r = await admin.post("/v1/nodes", {"name": name, "gpu_model": "H100", "gpu_count": 8, **where})
    assert r.status == 202
    hits = await commands.wait_for(lambda i: i[1]["data"]["node_id"] == r.body["id"])
    assert {k: hits[0][1]["data"][k] for k in where} == where
    bad = await admin.post("/v1/nodes", {"name": f"n-{uuid.uuid4().hex[:8]}", "gpu_model": "H100", "gpu_count": 8,
                                         "pool": "Not_A_Pool"})
    assert bad.status == 422 and bad.body["errors"][0]["field"] == "pool"
