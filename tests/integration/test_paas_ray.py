"""The Ray driver with REAL Ray (its own venv) in REAL namespace slots: two "nodes" (network namespaces with a veth
on a tenant bridge, one logical GPU each) run a cluster, the head on the first; a second tenant's slot, on its
own bridge, cannot reach the head. One cluster for the module: Ray's start is the slow part."""
from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

from services.paas.adapters.ray import RayRuntime
from services.paas.adapters.ray.commands import DASHBOARD_PORT, GCS_PORT
from services.paas.adapters.ray.processes import alive, marked
from services.paas.adapters.ray.runtime import REPO_VENV
from services.paas.domain.runtime import TERMINAL, ClusterHandle, ClusterSpec, JobSpec
from tests.support.paas_slots import Tenant, tcp_connects
from tests.support.polling import eventually

pytestmark = [
    # a minute of real Ray; the suite keeps tests/e2e/test_paas.py's Ray cluster and job (start, a job across both
    # nodes, its logs, delete); `./taskw test:long` runs these
    pytest.mark.long,
    pytest.mark.skipif(os.geteuid() != 0, reason="Ray's daemons in namespace slots need root"),
    pytest.mark.skipif(not (REPO_VENV / "bin" / "ray").exists(), reason="Ray's venv (.venv-ray): ./taskw builds it"),
    pytest.mark.skipif(shutil.which("socat") is None, reason="socat bridges the Jobs API to a Unix socket"),
]

JOB_TIMEOUT = 90
# One GPU task pinned on each node (by Ray's per-node resource), each reporting where it ran and the GPU Ray gave it.
FAN_OUT = """
import os, ray
ray.init()
print("driver CUDA_VISIBLE_DEVICES=" + str(os.environ.get("CUDA_VISIBLE_DEVICES")), "GREETING=" + os.environ["GREETING"])
where = ray.remote(num_gpus=1)(lambda: (ray.util.get_node_ip_address(), os.environ["CUDA_VISIBLE_DEVICES"]))
ips = sorted(n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"])
for ip, gpu in ray.get([where.options(resources={"node:" + ip: 0.01}).remote() for ip in ips]):
    print(f"task on {ip} CUDA_VISIBLE_DEVICES={gpu}")
"""





@pytest.fixture(scope="module")
def state_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("ray")


@pytest.fixture(scope="module")
async def cluster(state_root):
    """Tenant A's two-node cluster and tenant B's lone slot (same subnet, its own bridge); stopped, and the
    namespaces removed, even on failure."""
    tenant, other = Tenant("10.94.1", 2, first=10).build(), Tenant("10.94.1", 1, first=50)
    runtime = RayRuntime(state_root)
    spec = tenant.spec("alpha", "ray")
    try:
        other.build()
        handle = await runtime.start(spec)
        yield runtime, spec, handle, tenant, other
    finally:
        await runtime.stop(ClusterHandle(spec.cluster_id, "", "", "ray"))
        tenant.destroy()
        other.destroy()


def job(command: tuple[str, ...], **kw) -> JobSpec:
    return JobSpec(job_id=uuid.uuid4(), name="j", command=command, **kw)


async def until_state(runtime, handle, external_id: str, *states: str):
    wanted = set(states)
    return await eventually(lambda: runtime.job(handle, external_id), timeout=JOB_TIMEOUT, interval=0.25,
                            until=lambda s: s.state in wanted,
                            fail_if=lambda s: s.state in TERMINAL - wanted, what=f"{external_id} in {wanted}")


async def test_the_cluster_answers_on_its_socket_with_both_nodes_idle(cluster):
    runtime, spec, handle, _, _ = cluster
    assert handle.driver == "ray" and handle.controller == f"{spec.controller.address}:{GCS_PORT}"
    socket = Path(handle.api.removeprefix("unix:"))
    assert socket.is_socket() and socket.stat().st_mode & 0o777 == 0o600
    assert handle.details["ray_version"] == "2.60.0"
    uses = await runtime.nodes(handle)
    assert [(u.name, u.state, u.gpus_in_use) for u in uses] == [("alpha-0", "idle", 0), ("alpha-1", "idle", 0)]


async def test_a_job_fans_out_a_gpu_task_to_each_node_and_succeeds_with_its_output(cluster):
    runtime, spec, handle, _, _ = cluster
    external = await runtime.submit(handle, job(("python", "-c", FAN_OUT), env={"GREETING": "hello"}))
    status = await until_state(runtime, handle, external, "SUCCEEDED")
    assert status.exit_code == 0 and status.started_at <= status.ended_at and status.nodes[0] in ("alpha-0", "alpha-1")
    logs = await runtime.logs(handle, external)
    assert "GREETING=hello" in logs
    for node in spec.nodes:
        assert f"task on {node.address} CUDA_VISIBLE_DEVICES=0" in logs
    assert len(await runtime.logs(handle, external, limit_bytes=40)) <= 40


async def test_submitting_the_same_job_again_returns_the_same_id(cluster):
    runtime, _, handle, _, _ = cluster
    same = job(("true",))
    first = await runtime.submit(handle, same)
    assert first == f"tessera-{same.job_id}" and await runtime.submit(handle, same) == first
    await until_state(runtime, handle, first, "SUCCEEDED")


async def test_a_failing_job_reports_its_exit_code(cluster):
    runtime, _, handle, _, _ = cluster
    external = await runtime.submit(handle, job(("sh", "-c", "echo oops; exit 3")))
    status = await until_state(runtime, handle, external, "FAILED")
    assert status.exit_code == 3 and "oops" in await runtime.logs(handle, external)


async def test_a_job_asking_more_gpus_than_any_node_has_waits_and_counts_as_pending(cluster):
    runtime, _, handle, _, _ = cluster
    external = await runtime.submit(handle, job(("true",), gpus_per_task=2))
    assert (await runtime.job(handle, external)).state == "PENDING"
    assert await runtime.pending(handle) >= 1
    await runtime.cancel(handle, external)
    await until_state(runtime, handle, external, "CANCELLED")


async def test_a_cancelled_long_job_reads_cancelled(cluster):
    runtime, _, handle, _, _ = cluster
    external = await runtime.submit(handle, job(("sleep", "600")))
    await until_state(runtime, handle, external, "RUNNING")
    await runtime.cancel(handle, external)
    status = await until_state(runtime, handle, external, "CANCELLED")
    assert status.ended_at is not None
    await runtime.cancel(handle, external)          # a finished job is fine


async def test_a_job_past_its_time_limit_is_stopped_on_its_node_and_reads_timeout(cluster):
    runtime, _, handle, _, _ = cluster
    external = await runtime.submit(handle, job(("sleep", "600"), time_limit_s=1))
    status = await until_state(runtime, handle, external, "TIMEOUT")
    assert status.exit_code == 124 and "time limit of 1s" in status.message and status.ended_at is not None


def test_a_second_tenant_cannot_reach_the_head_but_the_worker_can(cluster):
    _, spec, _, tenant, other = cluster
    head = spec.controller.address
    for port in (GCS_PORT, DASHBOARD_PORT):
        assert tcp_connects(tenant.slots[1], head, port), "the worker's path works: the denial below is isolation"
        assert not tcp_connects(other.slots[0], head, port)


async def test_a_drained_worker_reads_drained_then_scales_in_and_out(cluster):
    runtime, spec, handle, _, _ = cluster
    await runtime.drain(handle, "alpha-1", "scale-in")
    await eventually(lambda: runtime.nodes(handle), timeout=JOB_TIMEOUT, interval=0.25,
                     until=lambda uses: [u.state for u in uses] == ["idle", "drained"], what="alpha-1 drained")
    smaller = ClusterSpec(spec.cluster_id, spec.tenant_id, spec.name, "ray", spec.nodes[:1])
    handle = await runtime.set_nodes(smaller, handle)
    assert set(handle.details["nodes"]) == {"alpha-0"} and not marked(str(spec.cluster_id), "alpha-1")
    handle = await runtime.set_nodes(spec, handle)   # returns once alpha-1 has joined again
    assert [u.state for u in await runtime.nodes(handle)] == ["idle", "idle"]


async def test_start_again_is_the_same_cluster_and_stop_leaves_no_process_and_no_file(cluster):
    runtime, spec, handle, _, _ = cluster
    again = await runtime.start(spec)
    assert again.details["nodes"]["alpha-0"] == handle.details["nodes"]["alpha-0"]
    pids = marked(str(spec.cluster_id))
    assert len(pids) >= 4                             # two ray starts, their raylets, socat, the GCS…
    await runtime.stop(again)
    assert [p for p in pids if alive(p)] == []
    assert not Path(again.details["state_dir"]).exists() and not Path(again.details["temp_root"]).exists()
    await runtime.stop(again)                         # stopped is fine
