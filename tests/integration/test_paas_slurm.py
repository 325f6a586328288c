"""The Slurm driver with REAL daemons in REAL namespace slots: two "nodes" (network namespaces with a veth on a
tenant bridge, one GPU stand-in each) run a cluster; a second tenant's cluster runs beside it, isolated."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from services.paas.adapters.slurm import SlurmRuntime
from services.paas.adapters.slurm.processes import alive
from services.paas.domain.runtime import ClusterError, ClusterHandle, ClusterSpec, JobSpec
from tests.support.paas_slots import Tenant
from tests.support.polling import eventually

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="Slurm's daemons in namespace slots need root")

JOB_TIMEOUT = 60




def all_pids(handle) -> list[int]:
    return list(handle.details["pids"].values())


@pytest.fixture(scope="module", autouse=True)
def clean_streams():
    """These tests use no bus: the suite's NATS and PostgreSQL are not started for them."""


@pytest.fixture(scope="module")
def state_root():
    """Not under pytest's tmp folder (0700 at times): slurmrestd runs as nobody and reads the cluster's slurm.conf."""
    root = Path(tempfile.mkdtemp(prefix="tessera-slurm-"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
async def cluster(state_root):
    """Tenant A's two-node cluster, started once for the module; stopped (and checked gone) even on failure."""
    tenant = Tenant("10.93.1", 2).build()
    runtime = SlurmRuntime(state_root)
    spec = tenant.spec("alpha", "slurm")
    handle = None
    try:
        handle = await runtime.start(spec)
        yield runtime, spec, handle, tenant
    finally:
        try:
            await runtime.stop(handle or _bare_handle(spec, state_root))
        finally:
            tenant.destroy()


def _bare_handle(spec, state_root):
    return ClusterHandle(spec.cluster_id, "", "", "slurm", {"state_dir": str(state_root / str(spec.cluster_id))})


def job(command: str, tasks: int = 1, gpus: int = 0, job_id: uuid.UUID | None = None) -> JobSpec:
    return JobSpec(job_id=job_id or uuid.uuid4(), name="t", command=("sh", "-c", command), tasks=tasks,
                   gpus_per_task=gpus, time_limit_s=90)


async def finished(runtime, handle, external_id: str):
    return await eventually(lambda: runtime.job(handle, external_id), timeout=JOB_TIMEOUT,
                            until=lambda s: s.state in ("SUCCEEDED", "FAILED", "CANCELLED", "TIMEOUT"),
                            fail_if=lambda s: "Held" in s.message,
                            what=f"job {external_id} to end")


async def test_a_two_node_gpu_job_runs_one_task_on_each_node_and_succeeds(cluster):
    runtime, spec, handle, _ = cluster
    assert handle.driver == "slurm" and handle.controller == "10.93.1.1:6817"
    assert handle.api.startswith("unix:") and Path(handle.api[5:]).is_socket()
    external = await runtime.submit(handle, job('echo "task on $(hostname) $SLURMD_NODENAME gpu=$CUDA_VISIBLE_DEVICES"',
                                                tasks=2, gpus=1))
    status = await finished(runtime, handle, external)
    assert (status.state, status.exit_code) == ("SUCCEEDED", 0), status
    assert set(status.nodes) == {"alpha-0", "alpha-1"}
    out = await runtime.logs(handle, external)
    assert "task on alpha-0 alpha-0 gpu=0" in out and "task on alpha-1 alpha-1 gpu=0" in out, out


async def test_submitting_the_same_job_again_returns_the_same_slurm_job(cluster):
    runtime, _, handle, _ = cluster
    spec = job("true")
    first = await runtime.submit(handle, spec)
    assert await runtime.submit(handle, spec) == first
    jobs = [j for j in await runtime._rest(handle).jobs() if j.get("comment") == f"tessera:{spec.job_id}"]
    assert len(jobs) == 1


async def test_a_job_asking_more_gpus_than_any_node_has_is_refused_for_good(cluster):
    runtime, _, handle, _ = cluster
    greedy = job("true", tasks=1, gpus=2)
    for _ in range(2):   # Slurm keeps a FAILED record of the refusal: a retry is refused alike, not handed that
        with pytest.raises(ClusterError) as refused:
            await runtime.submit(handle, greedy)
        assert refused.value.permanent
        assert "Requested node configuration is not available" in str(refused.value)


async def test_a_failing_job_reports_its_exit_code(cluster):
    runtime, _, handle, _ = cluster
    status = await finished(runtime, handle, await runtime.submit(handle, job("exit 3")))
    assert (status.state, status.exit_code) == ("FAILED", 3)


async def test_a_second_tenant_cannot_reach_nor_authenticate_to_the_first(cluster, state_root):
    runtime, spec_a, handle_a, _ = cluster
    other = Tenant("10.93.2", 1).build()
    spec_b = other.spec("beta", "slurm")
    handle_b = None
    try:
        handle_b = await runtime.start(spec_b)
        probe = subprocess.run(["ip", "netns", "exec", other.slots[0], "bash", "-c",
                                "exec 3<>/dev/tcp/10.93.1.1/6817"], capture_output=True, text=True, timeout=30)
        assert probe.returncode != 0 and "unreachable" in probe.stderr.lower(), probe.stderr
        # B's munge key against A's controller: B's configuration pointed at A's address, run where A is reachable
        conf_b = Path(handle_b.details["slurm_conf"])
        forged = conf_b.with_name("forged.conf")
        forged.write_text(conf_b.read_text().replace("SlurmctldHost=beta-0(10.93.2.1)", "SlurmctldHost=alpha-0(10.93.1.1)"))
        sinfo = subprocess.run(["ip", "netns", "exec", spec_a.nodes[1].netns, "sinfo", "-h"], capture_output=True,
                               text=True, timeout=60, env={**os.environ, "SLURM_CONF": str(forged)})
        assert sinfo.returncode != 0, sinfo.stdout
        log_a = Path(handle_a.details["logs"]) / "slurmctld.log"
        await eventually(lambda: "Munge decode failed: Invalid credential" in log_a.read_text(), timeout=10,
                         what="A's controller to refuse B's munge credential")
        own = subprocess.run(["ip", "netns", "exec", spec_a.nodes[1].netns, "sinfo", "-h"], capture_output=True,
                             text=True, timeout=60, env={**os.environ, "SLURM_CONF": handle_a.details["slurm_conf"]})
        assert own.returncode == 0 and "alpha-[0-1]" in own.stdout, own.stderr
    finally:
        try:
            await runtime.stop(handle_b or _bare_handle(spec_b, state_root))
        finally:
            other.destroy()


async def test_a_drained_node_drains_after_its_job_then_the_cluster_scales_in_and_out(cluster, state_root):
    runtime, spec, handle, _ = cluster
    release = Path(handle.details["jobs_dir"]) / f"release-{uuid.uuid4().hex[:6]}"
    external = await runtime.submit(handle, job(f"while [ ! -e {release} ]; do sleep 0.1; done", tasks=2, gpus=1))
    await eventually(lambda: runtime.job(handle, external), timeout=JOB_TIMEOUT, until=lambda s: s.state == "RUNNING")
    await runtime.drain(handle, "alpha-1", "scale in")
    use = {n.name: n for n in await runtime.nodes(handle)}
    assert (use["alpha-1"].state, use["alpha-1"].running_jobs, use["alpha-1"].gpus_in_use) == ("draining", 1, 1)
    release.touch()
    assert (await finished(runtime, handle, external)).state == "SUCCEEDED"
    await eventually(lambda: runtime.nodes(handle), timeout=JOB_TIMEOUT,
                     until=lambda ns: {n.name: n.state for n in ns}["alpha-1"] == "drained")

    # a job running on alpha-0 and one queued behind it survive the controller's restart that scales in
    hold = release.with_name(release.name + "-hold")
    running = await runtime.submit(handle, job(f"while [ ! -e {hold} ]; do sleep 0.1; done", gpus=1))
    await eventually(lambda: runtime.job(handle, running), timeout=JOB_TIMEOUT, until=lambda s: s.state == "RUNNING")
    queued, dropped = [await runtime.submit(handle, job("true", gpus=1)) for _ in range(2)]
    await runtime.cancel(handle, dropped)
    assert (await runtime.job(handle, dropped)).state == "CANCELLED"
    assert await runtime.pending(handle) == 1

    gone = handle.details["pids"]["slurmd:alpha-1"]
    smaller = await runtime.set_nodes(ClusterSpec(spec.cluster_id, spec.tenant_id, spec.name, "slurm", spec.nodes[:1]), handle)
    assert [n.name for n in await runtime.nodes(smaller)] == ["alpha-0"] and not alive(gone)
    assert (await runtime.job(smaller, running)).state == "RUNNING"
    assert (await runtime.job(smaller, queued)).state == "PENDING"
    hold.touch()
    assert (await finished(runtime, smaller, queued)).state == "SUCCEEDED"
    await runtime.cancel(smaller, running)   # a finished job is fine

    bigger = await runtime.set_nodes(spec, smaller)
    assert {n.name: n.state for n in await runtime.nodes(bigger)} == {"alpha-0": "idle", "alpha-1": "idle"}
    assert (await runtime.set_nodes(spec, bigger)).details["pids"] == bigger.details["pids"]   # nothing to change


async def test_start_again_is_the_same_cluster_and_stop_removes_every_process_and_file(cluster):
    runtime, spec, handle, _ = cluster
    again = await runtime.start(spec)
    assert again.details["pids"] == (await runtime.start(spec)).details["pids"]
    await runtime._children.kill_groups([again.details["pids"]["slurmd:alpha-1"]])   # a crashed node daemon
    healed = await runtime.start(spec)
    changed = {k for k, p in healed.details["pids"].items() if again.details["pids"][k] != p}
    assert changed == {"slurmd:alpha-1"}
    again = healed
    pids = all_pids(again)
    assert len(pids) == 5 and all(alive(p) for p in pids)
    await runtime.stop(again)
    assert not any(alive(p) for p in pids)
    assert not Path(again.details["state_dir"]).exists()
    await runtime.stop(again)   # a stopped cluster is fine
