"""The PaaS service against real NATS and PostgreSQL: a cluster made of allocations its tenant already holds. The
members start the cluster at once (no gang, nothing requested); a scale-in drains one and returns it; a scale-out
still adds a gang of new allocations; a delete stops the cluster and releases only what the cluster requested.
The scheduler, the allocations and the network are played on the bus; the cluster driver records."""
from __future__ import annotations

import uuid
from functools import partial

import pytest

from services.paas.bootstrap import build
from services.paas.settings import PaasSettings
from tests.support.bus import send_command
from tests.support.paas import RecordingRuntime, cluster_command, latest, place_and_activate, released, state_of
from tests.support.polling import eventually


@pytest.fixture
async def paas(run_service, nc, watch, tmp_path):
    runtime = RecordingRuntime()
    settings = PaasSettings(state_dir=str(tmp_path), reconcile_s=0.05)
    await run_service("paas", partial(build, paas=settings, runtimes={"slurm": runtime}))
    return runtime, nc.jetstream(), await watch("paas.evt.>"), await watch("scheduler.cmd.>"), \
        await watch("allocation.cmd.>")


def held(n: int, subnet: int = 20) -> list[dict]:
    """``n`` ACTIVE allocations of a tenant, as the gateway describes them in the create command."""
    return [{"allocation_id": str(uuid.uuid4()), "node_id": str(uuid.uuid4()), "attachment_id": str(uuid.uuid4()),
             "address": f"10.{subnet}.0.{10 + i}"} for i in range(n)]


def adopt_command(tenant, members: list[dict], **over) -> dict:
    return cluster_command(tenant, n=len(members), members=members, **over)


def of_tenant(items, tenant, type_: str | None = None) -> list:
    return [i for i in items if i[1]["data"].get("tenant_id") == str(tenant) and type_ in (None, i[1]["type"])]


async def shown(events, cmd, until) -> dict:
    """The cluster's newest document once ``until`` holds for it."""
    return await eventually(lambda: latest(events, cmd["cluster_id"]), timeout=20,
                            until=lambda d: d is not None and until(d), what=f"cluster {cmd['name']}")


def scale(js, cmd, n: int):
    return send_command(js, "paas.scale_cluster", {"cluster_id": cmd["cluster_id"], "tenant_id": cmd["tenant_id"],
                                                   "node_count": n, "requested_by": "alice"})


def delete(js, cmd):
    return send_command(js, "paas.delete_cluster", {"cluster_id": cmd["cluster_id"], "tenant_id": cmd["tenant_id"],
                                                    "requested_by": "alice"})


async def test_adopted_allocations_start_the_cluster_without_a_gang_and_a_scale_in_returns_one(paas):
    runtime, js, events, sched, allocs = paas
    tenant, members = uuid.uuid4(), held(3)
    cmd = adopt_command(tenant, members, name="mine")
    await send_command(js, "paas.create_cluster", cmd)
    ready = await state_of(events, cmd["cluster_id"], "ready")
    assert [(n["name"], n["allocation_id"], n["address"], n["adopted"]) for n in ready["nodes"]] == [
        (f"mine-{i}", m["allocation_id"], m["address"], True) for i, m in enumerate(members)]
    assert ready["controller"] == "10.20.0.10:6817"
    [spec] = runtime.names("start")
    assert [(n.name, n.address) for n in spec.nodes] == [(f"mine-{i}", m["address"]) for i, m in enumerate(members)]
    assert all(n.netns for n in spec.nodes)       # each daemon in its allocation's own slot
    assert not of_tenant(sched.items, tenant) and not of_tenant(allocs.items, tenant)

    await scale(js, cmd, 2)
    await eventually(lambda: runtime.names("drain"), timeout=20, what="the node drained in the cluster's scheduler")
    assert runtime.names("drain") == ["mine-2"]
    runtime.node_states["mine-2"] = "drained"
    back = await shown(events, cmd, lambda d: d["state"] == "ready" and d["nodes"][-1]["state"] == "returned")
    assert [n["state"] for n in back["nodes"]] == ["ready", "ready", "returned"]
    assert [n.name for n in runtime.names("set_nodes")[-1].nodes] == ["mine-0", "mine-1"]
    assert not of_tenant(allocs.items, tenant)        # drained and taken out, never released


async def test_a_scale_out_adds_a_gang_and_a_delete_releases_only_the_new_allocation(paas):
    runtime, js, events, sched, allocs = paas
    tenant, members = uuid.uuid4(), held(2, subnet=21)
    cmd = adopt_command(tenant, members, name="grow")
    await send_command(js, "paas.create_cluster", cmd)
    await state_of(events, cmd["cluster_id"], "ready")
    await scale(js, cmd, 3)
    [new] = await place_and_activate(js, sched, allocs, cmd)
    grown = await shown(events, cmd, lambda d: d["state"] == "ready" and len(d["nodes"]) == 3)
    assert [(n["state"], n["adopted"]) for n in grown["nodes"]] == [("ready", True), ("ready", True),
                                                                     ("ready", False)]
    [gang] = of_tenant(sched.items, tenant, "scheduler.reserve_gang")
    assert gang[1]["data"]["members"] == [new] and gang[1]["data"]["shape"] == cmd["shape"]

    await delete(js, cmd)
    [release] = await allocs.wait_for(lambda i: i[1]["type"] == "allocation.release"
                                      and i[1]["data"]["tenant_id"] == str(tenant))
    assert release[1]["data"]["allocation_id"] == new and runtime.names("stop")
    await released(js, tenant, new)
    deleted = await state_of(events, cmd["cluster_id"], "deleted")
    assert [n["state"] for n in deleted["nodes"]] == ["returned", "returned", "released"]
    assert len(of_tenant(allocs.items, tenant, "allocation.release")) == 1


async def test_a_returned_allocation_joins_another_cluster_and_a_live_node_joins_none(paas):
    runtime, js, events, sched, allocs = paas
    tenant, members = uuid.uuid4(), held(2, subnet=22)
    first = adopt_command(tenant, members, name="first")
    await send_command(js, "paas.create_cluster", first)
    await state_of(events, first["cluster_id"], "ready")
    await delete(js, first)
    gone = await state_of(events, first["cluster_id"], "deleted")     # nothing to wait for: none is released
    assert [n["state"] for n in gone["nodes"]] == ["returned", "returned"]

    second = adopt_command(tenant, members, name="second")
    await send_command(js, "paas.create_cluster", second)
    await state_of(events, second["cluster_id"], "ready")
    third = adopt_command(tenant, [members[1], *held(1, subnet=23)], name="third")
    await send_command(js, "paas.create_cluster", third)
    refused = await state_of(events, third["cluster_id"], "failed")
    assert refused["reason"] == f"allocation {members[1]['allocation_id']} is a node of cluster " \
                                f"{second['cluster_id']} already" and refused["nodes"] == []
    assert not of_tenant(allocs.items, tenant) and not of_tenant(sched.items, tenant)
