"""POST /v1/clusters over allocations the tenant already holds (``allocation_ids``), against real NATS and
PostgreSQL: the accepted form and the command it sends, and each refusal, naming the allocation. The allocation
and network services are played by publishing their events; the paas service by its documents."""
from __future__ import annotations

import uuid

import pytest

from tests.integration.test_gateway_clusters import paas_says, sent, shown
from tests.support.gateway import assert_problem, ensure_default_shapes, project

AT = "2030-01-01T00:00:00Z"


@pytest.fixture
async def shapes(api, nc) -> None:
    await ensure_default_shapes(api, nc)


async def allocation(client, **over) -> dict:
    r = await client.post("/v1/allocations", {"name": f"a-{uuid.uuid4().hex[:8]}", "shape": "vm.1gpu", **over})
    assert r.status == 202, r.body
    return r.body


async def attached(api, nc, a: dict, network_id: str, ip: str) -> dict:
    """Play the network service: ``a`` attached to ``network_id`` at ``ip``; returns the attachment."""
    node_id, saga = str(uuid.uuid4()), uuid.uuid4()
    att = {"attachment_id": str(uuid.uuid4()), "allocation_id": a["id"], "network_id": network_id,
           "ip_address": ip, "prefix_len": 24, "mac_address": "52:54:00:00:00:08"}
    await project(api, nc, "network.network_attached", {
        "saga_id": saga, "step": "attach_network", "idempotency_key": f"{saga}:attach_network",
        "allocation_id": a["id"], "attachment_id": att["attachment_id"], "vni": 4343, "ip_address": ip,
        "mac_address": att["mac_address"], "node_id": node_id, "attachment": att,
        "tenant_networks": {"tenant_id": a["tenant_id"], "version": 1, "networks": []}}, a["tenant_id"])
    return {**att, "node_id": node_id}


async def activated(api, nc, a: dict, node_id: str | None = None) -> None:
    saga = uuid.uuid4()
    await project(api, nc, "allocation.activated", {
        "allocation_id": a["id"], "tenant_id": a["tenant_id"], "state": "ACTIVE", "at": AT, "saga_id": saga,
        "step": "activate", "idempotency_key": f"{saga}:activate", "node_id": node_id or str(uuid.uuid4())},
        a["tenant_id"])


async def held(api, nc, client, network_id: str, ip: str, **over) -> tuple[dict, dict]:
    """An ACTIVE allocation of the client's tenant on ``network_id`` at ``ip``, and its attachment."""
    a = await allocation(client, **over)
    att = await attached(api, nc, a, network_id, ip)
    await activated(api, nc, a, att["node_id"])
    return a, att


def adopt(name: str, *ids: str, **over) -> dict:
    return {"name": name, "kind": "slurm", "allocation_ids": list(ids), **over}


async def test_a_cluster_over_held_allocations_sends_them_as_members_and_takes_them_once(api, nc, watch, shapes):
    admin, tenant_id = await api.tenant_user("tenant_admin")
    net = str(uuid.uuid4())
    (a, att_a), (b, att_b) = [await held(api, nc, admin, net, f"10.30.0.{i}") for i in (10, 11)]
    commands = await watch("paas.cmd.create_cluster")
    r = await admin.post("/v1/clusters", adopt("mine", b["id"], a["id"], autoscaling={"min_nodes": 1,
                                                                                       "max_nodes": 4}))
    assert r.status == 202, r.body
    c = r.body
    assert (c["shape"], c["gpu_count"], c["node_count"], c["network_id"], c["state"]) == (
        "vm.1gpu", 1, 2, net, "placing")
    assert [(n["name"], n["allocation_id"], n["state"], n["address"], n["adopted"]) for n in c["nodes"]] == [
        ("mine-0", b["id"], "active", "10.30.0.11", True), ("mine-1", a["id"], "active", "10.30.0.10", True)]
    [(_, env, _)] = await commands.wait_for(lambda i: i[1]["data"]["cluster_id"] == c["id"])
    assert (env["data"]["shape"], env["data"]["node_count"], env["data"]["network_id"]) == ("vm.1gpu", 2, net)
    assert env["data"]["members"] == [
        {"allocation_id": x["id"], "node_id": att["node_id"], "attachment_id": att["attachment_id"],
         "address": att["ip_address"]} for x, att in ((b, att_b), (a, att_a))]
    # taken until the cluster lets them go: the nodes shown at once, before any document of the paas service
    taken = assert_problem(await admin.post("/v1/clusters", adopt("again", a["id"])), 409, "allocation_ids.0")
    assert taken["type"].endswith("/allocation-in-cluster") and c["id"] in taken["detail"]
    nodes = [{**n, "state": "returned"} for n in c["nodes"]]
    await paas_says(api, nc, c, 5, "deleted", nodes=nodes)
    await shown(admin, "/v1/clusters?limit=100", lambda body: not body["items"])
    again = await admin.post("/v1/clusters", adopt("again", a["id"]))
    assert again.status == 202, again.body
    assert await sent(api, "paas.create_cluster", tenant_id) == 2


async def test_each_allocation_that_cannot_be_a_node_is_refused_by_name_and_nothing_is_sent(api, nc, shapes):
    admin, tenant_id = await api.tenant_user("tenant_admin")
    other, _ = await api.tenant_user("tenant_admin")
    net = str(uuid.uuid4())
    ok, _ = await held(api, nc, admin, net, "10.31.0.10")
    theirs, _ = await held(api, nc, other, net, "10.31.0.11")
    pending = await allocation(admin)
    spot, _ = await held(api, nc, admin, net, "10.31.0.12", spot=True)
    unattached = await allocation(admin)
    await activated(api, nc, unattached)
    elsewhere, _ = await held(api, nc, admin, str(uuid.uuid4()), "10.32.0.10")
    bigger, _ = await held(api, nc, admin, net, "10.31.0.13", shape="vm.2gpu")
    gang_member, _ = await held(api, nc, admin, net, "10.31.0.14")
    refusals = [
        ([ok["id"], theirs["id"]], 404, "not-found", theirs["id"]),
        ([str(uuid.uuid4())], 404, "not-found", None),
        ([ok["id"], pending["id"]], 409, "allocation-not-active", pending["id"]),
        ([spot["id"]], 409, "allocation-is-spot", spot["id"]),
        ([unattached["id"]], 409, "allocation-not-attached", unattached["id"]),
        ([ok["id"], elsewhere["id"]], 409, "allocations-on-different-networks", elsewhere["id"]),
        ([ok["id"], bigger["id"]], 409, "allocations-of-different-shapes", bigger["id"]),
    ]
    for ids, status, slug, named in refusals:
        problem = assert_problem(await admin.post("/v1/clusters", adopt("nope", *ids)), status,
                                 f"allocation_ids.{len(ids) - 1}")
        assert problem["type"].endswith(f"/{slug}"), problem
        assert named is None or named in problem["detail"], problem
    # a gang cluster's own allocation, before the paas service's first document names it
    gang = await admin.post("/v1/clusters", {"name": "gang", "kind": "ray", "shape": "vm.1gpu", "nodes": 1})
    assert gang.status == 202, gang.body
    await api.scalar("UPDATE allocations_view SET labels = jsonb_build_object('tessera.cluster', $2::text) "
                     "WHERE id=$1", uuid.UUID(gang_member["id"]), gang.body["id"])
    in_gang = assert_problem(await admin.post("/v1/clusters", adopt("nope", gang_member["id"])), 409)
    assert in_gang["type"].endswith("/allocation-in-cluster")
    assert await sent(api, "paas.create_cluster", tenant_id) == 1        # the gang cluster's only


@pytest.mark.parametrize("over", [
    {"shape": "vm.1gpu"}, {"nodes": 2}, {"shape": "vm.1gpu", "nodes": 2}, {"allocation_ids": []},
    {"allocation_ids": None}, {"allocation_ids": ["nope"]}, {"allocation_ids": [str(uuid.uuid4())] * 2},
    {"allocation_ids": [str(uuid.uuid4()) for _ in range(65)]},
])
async def test_a_body_of_neither_or_both_forms_or_a_bad_id_list_is_a_422(api, shapes, over):
    admin, tenant_id = await api.tenant_user("tenant_admin")
    r = await admin.post("/v1/clusters", {**adopt("x", str(uuid.uuid4())), **over})
    assert_problem(r, 422)
    assert await sent(api, "paas.create_cluster", tenant_id) == 0


async def test_neither_form_is_a_422(api, shapes):
    admin, _ = await api.tenant_user("tenant_admin")
    assert_problem(await admin.post("/v1/clusters", {"name": "x", "kind": "slurm"}), 422)
