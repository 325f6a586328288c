"""The PaaS service against real NATS and PostgreSQL: a cluster's life (gang, allocations, start, scale, delete) and a
job's, with the scheduler, the allocations and the network played on the bus and a recording cluster driver."""
from __future__ import annotations

import uuid
from functools import partial

import pytest

from services.paas.bootstrap import build
from services.paas.settings import PaasSettings
from tests.support.bus import publish_event, send_command
from tests.support.paas import RecordingRuntime, cluster_command, place_and_activate, released, state_of
from tests.support.polling import eventually


@pytest.fixture
async def paas(run_service, nc, watch, tmp_path):
    runtime = RecordingRuntime()
    settings = PaasSettings(state_dir=str(tmp_path), reconcile_s=0.05, max_gpus_per_job=4)
    rt = await run_service("paas", partial(build, paas=settings, runtimes={"slurm": runtime}))
    return rt, runtime, nc.jetstream(), await watch("paas.evt.>"), await watch("scheduler.cmd.>"), \
        await watch("allocation.cmd.>")


async def test_a_cluster_is_placed_as_one_gang_requested_started_and_runs_a_job_to_its_end(paas):
    rt, runtime, js, events, sched, allocs = paas
    tenant = uuid.uuid4()
    cmd = cluster_command(tenant)
    await send_command(js, "paas.create_cluster", cmd)
    placing = await state_of(events, cmd["cluster_id"], "placing")
    assert [n["state"] for n in placing["nodes"]] == ["placing", "placing"]
    members = await place_and_activate(js, sched, allocs, cmd)
    ready = await state_of(events, cmd["cluster_id"], "ready")
    assert ready["driver"] == "slurm" and ready["controller"].endswith(":6817")
    assert sorted(n["allocation_id"] for n in ready["nodes"]) == sorted(members)
    [spec] = runtime.names("start")
    assert [n.name for n in spec.nodes] == ["train-0", "train-1"] and all(n.netns for n in spec.nodes)

    job = {"job_id": str(uuid.uuid4()), "tenant_id": str(tenant), "user_id": cmd["user_id"],
           "cluster_id": cmd["cluster_id"], "name": "hello", "command": ["hostname"], "tasks": 2,
           "gpus_per_task": 1, "requested_by": "alice"}
    await send_command(js, "paas.submit_job", job)
    pending = await state_of(events, job["job_id"], "PENDING", kind="paas.job_changed", key="job_id")
    [submitted] = runtime.names("submit")
    assert submitted.tasks == 2 and submitted.gpus_per_task == 1 and submitted.command == ("hostname",)
    runtime.finish(pending["external_id"])
    done = await state_of(events, job["job_id"], "SUCCEEDED", kind="paas.job_changed", key="job_id")
    assert done["exit_code"] == 0 and done["ended_at"] and done["nodes"] == ["n-0", "n-1"]


async def test_a_job_the_policy_refuses_is_rejected_and_never_reaches_thecluster_command(paas):
    rt, runtime, js, events, sched, allocs = paas
    tenant = uuid.uuid4()
    cmd = cluster_command(tenant, name="policy")
    await send_command(js, "paas.create_cluster", cmd)
    await place_and_activate(js, sched, allocs, cmd)
    await state_of(events, cmd["cluster_id"], "ready")
    base = {"tenant_id": str(tenant), "user_id": cmd["user_id"], "cluster_id": cmd["cluster_id"],
            "command": ["true"], "requested_by": "alice"}
    privileged = {**base, "job_id": str(uuid.uuid4()), "name": "root", "privileged": True}
    greedy = {**base, "job_id": str(uuid.uuid4()), "name": "greedy", "tasks": 5, "gpus_per_task": 1}
    for job in (privileged, greedy):
        await send_command(js, "paas.submit_job", job)
    r1 = await state_of(events, privileged["job_id"], "REJECTED", kind="paas.job_changed", key="job_id")
    r2 = await state_of(events, greedy["job_id"], "REJECTED", kind="paas.job_changed", key="job_id")
    assert "privileged" in r1["reason"]
    assert "policy allows 4 GPUs" in r2["reason"] and "the cluster has 2 GPUs" in r2["reason"]
    assert runtime.names("submit") == []


async def test_a_refused_gang_fails_the_cluster_with_the_schedulers_reason(paas):
    rt, runtime, js, events, sched, allocs = paas
    cmd = cluster_command(uuid.uuid4(), n=3, name="toolarge")
    await send_command(js, "paas.create_cluster", cmd)
    [gang] = await sched.wait_for(lambda i: i[1]["data"].get("tenant_id") == cmd["tenant_id"])
    await publish_event(js, "scheduler.gang_queued", {"gang_id": gang[1]["data"]["gang_id"],
                                                      "tenant_id": cmd["tenant_id"], "position": 1,
                                                      "reason": "no capacity"}, tenant_id=cmd["tenant_id"])
    queued = await state_of(events, cmd["cluster_id"], "queued")
    assert "3 node(s) at once" in queued["reason"]
    await publish_event(js, "scheduler.gang_rejected", {"gang_id": gang[1]["data"]["gang_id"],
                                                        "tenant_id": cmd["tenant_id"], "reason": "quota 2 GPUs",
                                                        "code": "quota-exceeded"}, tenant_id=cmd["tenant_id"])
    failed = await state_of(events, cmd["cluster_id"], "failed")
    assert failed["reason"] == "quota-exceeded: quota 2 GPUs"
    assert not [i for i in allocs.items if i[1]["data"].get("tenant_id") == cmd["tenant_id"]]


async def test_scale_in_drains_before_it_releases_and_delete_stops_then_releases_every_node(paas):
    rt, runtime, js, events, sched, allocs = paas
    tenant = uuid.uuid4()
    cmd = cluster_command(tenant, n=3, name="elastic")
    await send_command(js, "paas.create_cluster", cmd)
    members = await place_and_activate(js, sched, allocs, cmd)
    await state_of(events, cmd["cluster_id"], "ready")
    await send_command(js, "paas.scale_cluster", {"cluster_id": cmd["cluster_id"], "tenant_id": str(tenant),
                                                  "node_count": 2, "requested_by": "alice"})
    await eventually(lambda: runtime.names("drain"), timeout=20, what="the node drained in the cluster's scheduler")
    assert runtime.names("drain")[0] == "elastic-2"
    assert not [i for i in allocs.items if i[1]["type"] == "allocation.release"]    # draining is not drained
    runtime.node_states["elastic-2"] = "drained"
    [release] = await allocs.wait_for(lambda i: i[1]["type"] == "allocation.release")
    assert release[1]["data"]["allocation_id"] == members[2]
    assert [n.name for n in runtime.names("set_nodes")[-1].nodes] == ["elastic-0", "elastic-1"]
    await released(js, tenant, members[2])
    ready = await state_of(events, cmd["cluster_id"], "ready")
    assert [n["state"] for n in ready["nodes"]] == ["ready", "ready", "released"]

    await send_command(js, "paas.delete_cluster", {"cluster_id": cmd["cluster_id"], "tenant_id": str(tenant),
                                                   "requested_by": "alice"})
    releases = await eventually(lambda: {i[1]["data"]["allocation_id"] for i in allocs.items
                                         if i[1]["type"] == "allocation.release"},
                                timeout=20, until=lambda s: len(s) == 3, what="every node released")
    assert releases == set(members) and runtime.names("stop")   # the scaled-in node's, and the two left
    for a in members[:2]:
        await released(js, tenant, a)
    await state_of(events, cmd["cluster_id"], "deleted")
