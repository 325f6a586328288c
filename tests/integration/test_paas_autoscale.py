"""A cluster with an autoscaling policy, against real NATS and PostgreSQL: it grows when jobs queue and shrinks
when a node sits idle for the whole window, draining it in the cluster's scheduler before releasing it. The loop
runs on short periods here (the defaults are NVIDIA's: a decision every 15 s over 70 s)."""
from __future__ import annotations

import uuid
from functools import partial

import pytest

from services.paas.bootstrap import build
from services.paas.settings import PaasSettings
from tests.support.bus import send_command
from tests.support.paas import RecordingRuntime, cluster_command, place_and_activate, released, state_of
from tests.support.polling import eventually


@pytest.fixture
async def paas(run_service, nc, watch, tmp_path):
    runtime = RecordingRuntime()
    settings = PaasSettings(state_dir=str(tmp_path), reconcile_s=0.05, utilisation="scheduler",
                            autoscale_tick_s=0.3, autoscale_window_s=0.9)
    await run_service("paas", partial(build, paas=settings, runtimes={"slurm": runtime}))
    return runtime, nc.jetstream(), await watch("paas.evt.>"), await watch("scheduler.cmd.>"), \
        await watch("allocation.cmd.>")


async def test_an_autoscaled_cluster_grows_when_jobs_queue_and_shrinks_when_idle_draining_first(paas):
    runtime, js, events, sched, allocs = paas
    tenant = uuid.uuid4()
    cmd = cluster_command(tenant, n=1, name="elastic",
                          autoscaling={"min_nodes": 1, "max_nodes": 2, "target_gpu_util": 0.7, "cooldown_s": 0})
    await send_command(js, "paas.create_cluster", cmd)
    await place_and_activate(js, sched, allocs, cmd)
    await state_of(events, cmd["cluster_id"], "ready")

    job = {"job_id": str(uuid.uuid4()), "tenant_id": str(tenant), "user_id": cmd["user_id"],
           "cluster_id": cmd["cluster_id"], "name": "wait", "command": ["sleep", "1"], "requested_by": "bob"}
    await send_command(js, "paas.submit_job", job)          # the recording scheduler keeps it PENDING
    grown = await state_of(events, cmd["cluster_id"], "scaling")
    assert grown["node_count"] == 2 and "job(s) pending" in grown["reason"]
    [second] = await place_and_activate(js, sched, allocs, cmd, gang=1)
    ready = await state_of(events, cmd["cluster_id"], "ready")
    assert [n["state"] for n in ready["nodes"]] == ["ready", "ready"]
    assert [n.name for n in runtime.names("set_nodes")[-1].nodes] == ["elastic-0", "elastic-1"]

    runtime.finish("1")                          # the queue empties and both nodes sit idle
    draining = await state_of(events, cmd["cluster_id"], "scaling", timeout=30)
    assert "elastic-1 idle" in draining["reason"] and draining["node_count"] == 1
    await eventually(lambda: runtime.names("drain"), timeout=20, what="elastic-1 drained in the scheduler")
    assert runtime.names("drain")[0] == "elastic-1"
    assert not [i for i in allocs.items if i[1]["type"] == "allocation.release"]
    runtime.node_states["elastic-1"] = "drained"
    [release] = await allocs.wait_for(lambda i: i[1]["type"] == "allocation.release")
    assert release[1]["data"]["allocation_id"] == second
    await released(js, tenant, second)
    shrunk = await state_of(events, cmd["cluster_id"], "ready")
    assert [n["state"] for n in shrunk["nodes"]] == ["ready", "released"]
