"""A cluster's node lost with its host, against real NATS and PostgreSQL: the allocations' failover (interrupted,
then ACTIVE again on another node, or FAILED) played on the bus, a recording cluster driver."""
from __future__ import annotations

import uuid
from functools import partial

import pytest

from services.paas.bootstrap import build
from services.paas.settings import PaasSettings
from shared.contract import durable_name, stream_name
from tests.support.bus import publish_event, send_command
from tests.support.paas import (
    RecordingRuntime,
    attach_and_activate,
    cluster_command,
    place_and_activate,
    released,
    state_of,
)
from tests.support.polling import eventually

AT = "2026-11-29T00:00:00Z"


@pytest.fixture
async def paas(run_service, nc, watch, tmp_path):
    runtime = RecordingRuntime()
    settings = PaasSettings(state_dir=str(tmp_path), reconcile_s=0.05, max_gpus_per_job=4)
    await run_service("paas", partial(build, paas=settings, runtimes={"slurm": runtime, "ray": runtime}))
    return runtime, nc.jetstream(), await watch("paas.evt.>"), await watch("scheduler.cmd.>"), \
        await watch("allocation.cmd.>")


async def interrupted(js, cmd, alloc, node):
    await publish_event(js, "allocation.interrupted", {
        "allocation_id": alloc, "tenant_id": cmd["tenant_id"], "state": "INTERRUPTED", "at": AT,
        "node_id": str(node), "category": "node_lost", "reason": "node stopped answering", "interrupted_at": AT,
        "next": "rescheduling on another node", "attempt": 1, "user_id": cmd["user_id"], "shape": cmd["shape"],
        "gpu_count": 1, "volume_gb": 0}, tenant_id=cmd["tenant_id"])


async def failed(js, cmd, alloc):
    await publish_event(js, "allocation.failed", {
        "allocation_id": alloc, "tenant_id": cmd["tenant_id"], "state": "FAILED", "at": AT,
        "failed_step": "reschedule", "reason": "node_lost: no capacity after 3 reschedules"},
        tenant_id=cmd["tenant_id"])


def node_states(cluster):
    return {n["name"]: n["state"] for n in cluster["nodes"]}


async def ready_cluster(paas, n=2, **over):
    runtime, js, events, sched, allocs = paas
    cmd = cluster_command(uuid.uuid4(), n=n, **over)
    await send_command(js, "paas.create_cluster", cmd)
    node = uuid.uuid4()
    members = await place_and_activate(js, sched, allocs, cmd, node)
    await state_of(events, cmd["cluster_id"], "ready")
    return cmd, members, node


async def running_job(paas, cmd, *nodes):
    runtime, js, events, _, _ = paas
    job = {"job_id": str(uuid.uuid4()), "tenant_id": cmd["tenant_id"], "user_id": cmd["user_id"],
           "cluster_id": cmd["cluster_id"], "name": "long", "command": ["sleep", "600"], "tasks": len(nodes),
           "requested_by": "alice"}
    await send_command(js, "paas.submit_job", job)
    pending = await state_of(events, job["job_id"], "PENDING", kind="paas.job_changed", key="job_id")
    runtime.run(pending["external_id"], *nodes)
    await state_of(events, job["job_id"], "RUNNING", kind="paas.job_changed", key="job_id")
    return job, pending["external_id"]


async def test_a_lost_node_comes_back_on_another_node_its_job_requeued_then_running_again(paas):
    runtime, js, events, sched, allocs = paas
    cmd, members, _ = await ready_cluster(paas, name="hpc")
    job, external = await running_job(paas, cmd, "hpc-0", "hpc-1")

    await interrupted(js, cmd, members[1], uuid.uuid4())
    lost = await state_of(events, cmd["cluster_id"], "scaling")
    assert node_states(lost) == {"hpc-0": "ready", "hpc-1": "lost"}
    assert lost["reason"].startswith("node hpc-1 lost: node_lost: node stopped answering")
    requeued = await state_of(events, job["job_id"], "PENDING", kind="paas.job_changed", key="job_id")
    assert requeued["reason"].startswith("requeued: node hpc-1 lost")
    # the scheduler still says RUNNING (it has not noticed): the job is left alone while its node is away
    assert not runtime.names("replace_node")

    new_node = uuid.uuid4()
    await publish_event(js, "allocation.rescheduled", {     # the allocation first, then its new attachment
        "allocation_id": members[1], "tenant_id": cmd["tenant_id"], "state": "ACTIVE", "at": AT,
        "from_node_id": str(uuid.uuid4()), "to_node_id": str(new_node), "interrupted_at": AT, "gap_s": 4.2,
        "attempt": 1}, tenant_id=cmd["tenant_id"])
    await attach_and_activate(js, cmd, members[1], new_node, "10.9.0.42")
    [node] = await eventually(lambda: runtime.names("replace_node"), timeout=20, what="the lost node replaced")
    assert (node.name, node.address) == ("hpc-1", "10.9.0.42") and node.netns, node
    ready = await state_of(events, cmd["cluster_id"], "ready")
    assert runtime.names("requeue") == [[external]]   # run again wherever the scheduler ended it instead
    assert node_states(ready) == {"hpc-0": "ready", "hpc-1": "ready"}
    assert ready["reason"].startswith("node hpc-1 back in service")
    assert {n["name"]: n["address"] for n in ready["nodes"]}["hpc-1"] == "10.9.0.42"
    history = [e[1]["data"] for e in events.items if e[1]["type"] == "paas.cluster_changed"
               and e[1]["data"]["cluster_id"] == cmd["cluster_id"]]
    assert "rejoining" in [node_states(h)["hpc-1"] for h in history]

    runtime.run(external, "hpc-0", "hpc-1")      # the scheduler ran it again once the node was back
    again = await state_of(events, job["job_id"], "RUNNING", kind="paas.job_changed", key="job_id")
    assert again["version"] > requeued["version"]
    runtime.finish(external)
    await state_of(events, job["job_id"], "SUCCEEDED", kind="paas.job_changed", key="job_id")


async def test_a_ray_job_whose_driver_node_is_lost_fails(paas):
    runtime, js, events, sched, allocs = paas
    cmd, members, _ = await ready_cluster(paas, name="rl", kind="ray")
    job, _ = await running_job(paas, cmd, "rl-1")
    await interrupted(js, cmd, members[1], uuid.uuid4())
    ended = await state_of(events, job["job_id"], "FAILED", kind="paas.job_changed", key="job_id")
    assert ended["reason"].startswith("node rl-1 lost: the job's driver died") and ended["ended_at"]


async def test_a_lost_node_whose_allocation_fails_shrinks_the_cluster(paas):
    runtime, js, events, sched, allocs = paas
    cmd, members, _ = await ready_cluster(paas, n=3, name="wide")
    await interrupted(js, cmd, members[2], uuid.uuid4())
    await state_of(events, cmd["cluster_id"], "scaling")
    await failed(js, cmd, members[2])
    smaller = await eventually(lambda: runtime.names("set_nodes"), timeout=20, what="the lost node taken out")
    assert [n.name for n in smaller[-1].nodes] == ["wide-0", "wide-1"]
    ready = await state_of(events, cmd["cluster_id"], "ready")
    assert ready["node_count"] == 2 and node_states(ready)["wide-2"] == "failed"
    assert ready["reason"] == "node wide-2 lost and not replaced: node_lost: no capacity after 3 reschedules; " \
                              "the cluster goes on with 2 node(s)"
    assert not runtime.names("replace_node")


async def test_a_lost_controller_node_that_is_not_replaced_fails_the_cluster_and_releases_the_rest(paas):
    runtime, js, events, sched, allocs = paas
    cmd, members, _ = await ready_cluster(paas, name="ctl")
    await interrupted(js, cmd, members[0], uuid.uuid4())
    await state_of(events, cmd["cluster_id"], "scaling")
    await failed(js, cmd, members[0])
    [release] = await allocs.wait_for(lambda i: i[1]["type"] == "allocation.release"
                                      and i[1]["data"]["allocation_id"] == members[1])
    assert runtime.names("stop")
    await released(js, cmd["tenant_id"], members[1])
    gone = await state_of(events, cmd["cluster_id"], "failed")
    assert gone["reason"].startswith("node ctl-0 (the controller) lost and not replaced")


async def test_a_node_the_driver_cannot_move_fails_the_cluster_saying_why(paas):
    runtime, js, events, sched, allocs = paas
    runtime.refuse_replace = "a Ray cluster keeps its head"
    cmd, members, _ = await ready_cluster(paas, name="head")
    await interrupted(js, cmd, members[0], uuid.uuid4())
    # lost before it comes back (its activation, on another consumer, would otherwise overtake the loss)
    await state_of(events, cmd["cluster_id"], "scaling")
    await attach_and_activate(js, cmd, members[0], uuid.uuid4(), "10.9.0.77")
    await allocs.wait_for(lambda i: i[1]["type"] == "allocation.release" and i[1]["data"]["allocation_id"] in members)
    for a in members:
        await released(js, cmd["tenant_id"], a)
    gone = await state_of(events, cmd["cluster_id"], "failed")
    assert gone["reason"] == "node head-0 was lost and could not be brought back: a Ray cluster keeps its head"


async def test_the_events_of_allocations_that_are_no_paas_node_are_acknowledged_untouched(run_service, nc, watch,
                                                                                            tmp_path):
    """Every allocation's events reach the paas. Those of an allocation that is no cluster's (or spot offering's)
    node are acknowledged without a transaction, leaving no inbox row; a node's are handled as before."""
    runtime = RecordingRuntime()
    rt = await run_service("paas", partial(build, paas=PaasSettings(state_dir=str(tmp_path), reconcile_s=0.05),
                                           runtimes={"slurm": runtime, "ray": runtime}))
    paas = (runtime, nc.jetstream(), await watch("paas.evt.>"), await watch("scheduler.cmd.>"),
            await watch("allocation.cmd.>"))
    js, events = paas[1], paas[2]
    cmd, members, _ = await ready_cluster(paas, n=2, name="mixed")

    def release(alloc):
        return publish_event(js, "allocation.released", {
            "allocation_id": alloc, "tenant_id": cmd["tenant_id"], "state": "RELEASED", "at": AT,
            "saga_id": str(uuid.uuid4()), "step": "mark_released", "idempotency_key": "x"}, tenant_id=cmd["tenant_id"])
    plain = await release(str(uuid.uuid4()))          # another allocation of the same tenant
    mine = await release(members[1])
    gone = await eventually(lambda: [e[1]["data"] for e in events.items if e[1]["type"] == "paas.cluster_changed"
                                     and node_states(e[1]["data"]).get("mixed-1") == "released"],
                            timeout=20, what="the node's release handled")
    assert node_states(gone[0])["mixed-0"] == "ready"
    consumer = durable_name("paas", "allocation.released")
    await eventually(lambda: js.consumer_info(stream_name("allocation"), consumer),
                     until=lambda i: i.num_ack_pending == 0 and i.num_pending == 0, timeout=20,
                     what="both releases acknowledged")
    async with rt.pool.acquire() as conn:
        handled = {r["event_id"] for r in await conn.fetch(
            "SELECT event_id FROM inbox WHERE consumer=$1 AND event_id = ANY($2::uuid[])", consumer, [plain.id, mine.id])}
    assert handled == {mine.id}
