"""Refusals shown on the object they are about, in the gateway's read models (the scheduler and the allocation
service are played by publishing their events): a node whose registration was refused is ``rejected`` with the
reason and frees its name; a shape's refusal shows under the shape, a pool's under the pool, even when a pool and
a shape share a name; a refused allocation request fails the allocation with the reason."""
from __future__ import annotations

import uuid

from tests.support.gateway import ensure_default_shapes, node_doc, project
from tests.support.polling import eventually

NUL_REFUSED = 'invalid data (CharacterNotInRepertoireError): invalid byte sequence for encoding "UTF8": 0x00'


def rejection(command: str, target: str, kind: str | None, reason: str = NUL_REFUSED) -> dict:
    data = {"command": command, "target": target, "reason": reason}
    return data if kind is None else {**data, "target_kind": kind}


async def test_a_node_whose_registration_was_refused_is_rejected_with_the_reason_and_frees_its_name(api, nc):
    admin = await api.admin()
    name = f"node-{uuid.uuid4().hex[:8]}"
    r = await admin.post("/v1/nodes", {"name": name, "gpu_model": "H100", "gpu_count": 8})
    assert r.status == 202 and r.body["status"] == "registering"
    node_id = r.body["id"]
    await project(api, nc, "scheduler.admin_command_rejected", rejection("scheduler.register_node", node_id, "node"))
    doc = (await admin.get(f"/v1/nodes/{node_id}")).body
    assert doc["status"] == "rejected" and doc["last_rejection"]["reason"] == NUL_REFUSED
    assert doc["last_rejection"]["command"] == "scheduler.register_node"
    listed = {n["id"]: n for n in (await admin.get("/v1/nodes")).body["items"]}
    assert listed[node_id]["status"] == "rejected"
    # registered again, corrected, under the same name: a new node, the refused one stays as it was
    again = await admin.post("/v1/nodes", {"name": name, "gpu_model": "H100", "gpu_count": 8})
    assert again.status == 202 and again.body["id"] != node_id and again.body["status"] == "registering"
    assert (await admin.get(f"/v1/nodes/{node_id}")).body["status"] == "rejected"


async def test_a_refused_command_about_a_known_node_shows_the_reason_and_keeps_its_status(api, nc):
    admin = await api.admin()
    node_id, name = str(uuid.uuid4()), f"node-{uuid.uuid4().hex[:8]}"
    await project(api, nc, "scheduler.node_changed", node_doc(node_id, name, 1))
    for command in ("scheduler.register_node", "scheduler.update_node"):
        await project(api, nc, "scheduler.admin_command_rejected", rejection(command, node_id, "node", f"{command} no"))
        doc = (await admin.get(f"/v1/nodes/{node_id}")).body
        assert (doc["status"], doc["last_rejection"]["reason"]) == ("pending_approval", f"{command} no")


async def test_a_shape_refusal_shows_under_the_shape_and_a_pool_refusal_under_the_pool_of_the_same_name(api, nc):
    await ensure_default_shapes(api, nc)
    admin = await api.admin()
    name = f"twin-{uuid.uuid4().hex[:8]}"
    await project(api, nc, "scheduler.shape_changed", {"name": name, "kind": "vm", "gpu_count": 2, "version": 1})
    await project(api, nc, "scheduler.pool_changed", {"name": name, "policy": "pack", "taints": {}, "description": "",
                                                      "version": 1})

    async def shown() -> tuple[dict | None, dict | None]:
        shapes = {s["name"]: s for s in (await admin.get("/v1/shapes")).body["items"]}
        pools = {p["name"]: p for p in (await admin.get("/v1/pools")).body["items"]}
        return shapes[name]["last_rejection"], pools[name]["last_rejection"]

    await project(api, nc, "scheduler.admin_command_rejected", rejection("scheduler.define_shape", name, "shape",
                                                                         "shape refused"))
    shape_rej, pool_rej = await shown()
    assert shape_rej["reason"] == "shape refused" and shape_rej["command"] == "scheduler.define_shape"
    assert pool_rej is None
    await project(api, nc, "scheduler.admin_command_rejected", rejection("scheduler.define_pool", name, "pool",
                                                                         "pool refused"))
    shape_rej, pool_rej = await shown()
    assert (shape_rej["reason"], pool_rej["reason"]) == ("shape refused", "pool refused")
    # an event from before the scheduler named the kind: the command says which
    await project(api, nc, "scheduler.admin_command_rejected", rejection("scheduler.define_shape", name, None,
                                                                         "older shape refusal"))
    shape_rej, pool_rej = await shown()
    assert (shape_rej["reason"], pool_rej["reason"]) == ("older shape refusal", "pool refused")
    kinds = await api.scalar("SELECT array_agg(target_kind ORDER BY recorded_at) FROM admin_rejections WHERE target=$1",
                             name)
    assert kinds == ["shape", "pool", "shape"]


async def test_a_refused_allocation_request_fails_the_allocation_with_the_reason(api, nc):
    await ensure_default_shapes(api, nc)
    client, tenant_id = await api.tenant_user()
    a = (await client.post("/v1/allocations", {"name": "refused", "shape": "vm.1gpu"})).body
    assert a["state"] == "REQUESTED"
    await project(api, nc, "allocation.command_rejected", {"allocation_id": a["id"], "command": "allocation.request",
                                                           "reason": NUL_REFUSED}, tenant_id)
    shown = await eventually(lambda: client.get(f"/v1/allocations/{a['id']}"), timeout=5,
                             until=lambda r: r.body["state"] != "REQUESTED")
    assert (shown.body["state"], shown.body["failed_step"], shown.body["reason"]) == ("FAILED", "request", NUL_REFUSED)
