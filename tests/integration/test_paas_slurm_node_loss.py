"""The Slurm driver's ``replace_node`` with REAL daemons in REAL namespace slots: a node's slot goes away with its
host (its processes killed, its namespace deleted), a new slot at a new address takes its place, and the job that
ran there is requeued by Slurm and completes."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from services.paas.adapters.slurm import SlurmRuntime
from services.paas.adapters.slurm.processes import alive
from services.paas.domain.runtime import ClusterHandle, JobSpec
from tests.support.paas_slots import Tenant, add_slot, ip
from tests.support.polling import eventually

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="Slurm's daemons in namespace slots need root")

JOB_TIMEOUT = 90


@pytest.fixture(scope="module", autouse=True)
def clean_streams():
    """These tests use no bus: the suite's NATS and PostgreSQL are not started for them."""


@pytest.fixture
async def cluster():
    """A two-node cluster on a tenant bridge; stopped, its slots (the new one too) removed, even on failure."""
    root = Path(tempfile.mkdtemp(prefix="tessera-slurm-loss-"))
    root.chmod(0o755)
    tenant = Tenant("10.93.4", 2).build()
    runtime, spec = SlurmRuntime(root), tenant.spec("hpc", "slurm")
    extra: list[str] = []
    try:
        yield runtime, spec, await runtime.start(spec), tenant, extra
    finally:
        try:
            await runtime.stop(ClusterHandle(spec.cluster_id, "", "", "slurm", {}))
        finally:
            for ns in extra:
                subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
            tenant.destroy()
            shutil.rmtree(root, ignore_errors=True)


def lose(netns: str) -> None:
    """The host goes: every process in the slot's namespace (slurmd, the job's step and task) dies with it."""
    pids = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True, timeout=30).stdout.split()
    subprocess.run(["kill", "-9", *pids], capture_output=True, timeout=30)
    ip("netns", "del", netns)


def new_slot(tenant: Tenant, index: int, address: str) -> str:
    """A slot on the tenant's bridge, as the reschedule's attachment makes on the new node."""
    ns = f"ts-{uuid.uuid4().hex[:12]}"
    add_slot(tenant.fabric, ns, f"r{index}", address)
    return ns


def job(command: str, tasks: int = 1, gpus: int = 0) -> JobSpec:
    return JobSpec(job_id=uuid.uuid4(), name="t", command=("sh", "-c", command), tasks=tasks, gpus_per_task=gpus,
                   time_limit_s=120)


async def ended(runtime, handle, external_id: str):
    return await eventually(lambda: runtime.job(handle, external_id), timeout=JOB_TIMEOUT,
                            until=lambda s: s.state in ("SUCCEEDED", "FAILED", "CANCELLED", "TIMEOUT"),
                            what=f"job {external_id} to end")


@pytest.mark.parametrize("lost", [1, 0], ids=["a-node", "the-controller-node"])
async def test_a_lost_node_is_replaced_in_a_new_slot_and_its_job_is_requeued_and_completes(cluster, lost):
    runtime, spec, handle, tenant, extra = cluster
    name = spec.nodes[lost].name
    release = Path(handle.details["jobs_dir"]) / "release"
    both = await runtime.submit(handle, job(f'echo "run on $(hostname)"; while [ ! -e {release} ]; do sleep 0.1; '
                                            'done', tasks=2, gpus=1))
    await eventually(lambda: runtime.job(handle, both), timeout=JOB_TIMEOUT, until=lambda s: s.state == "RUNNING")

    old_slurmd = handle.details["pids"][f"slurmd:{name}"]
    lose(spec.nodes[lost].netns)
    extra.append(new_slot(tenant, lost, "10.93.4.9"))
    moved = replace(spec.nodes[lost], address="10.93.4.9", netns=extra[0])
    nodes = list(spec.nodes)
    nodes[lost] = moved
    lost_at = int(time.time())
    back = await runtime.replace_node(replace(spec, nodes=tuple(nodes)), handle, moved)
    # what the service asks next of a job it shows requeued: its batch script may have seen the step on the lost
    # node killed and ended FAILED before slurmctld set the node down (then it is requeued here; else left alone)
    await runtime.requeue(back, [both])

    assert back.details["pids"][f"slurmd:{name}"] != old_slurmd and not alive(old_slurmd)
    assert f"NodeName={name} NodeAddr=10.93.4.9" in Path(back.details["slurm_conf"]).read_text()
    if lost == 0:
        assert back.controller == "10.93.4.9:6817" and back.details["controller_netns"] == extra[0]
    release.touch()                      # the requeued run may end: the first one was killed on both nodes
    status = await ended(runtime, back, both)
    assert (status.state, status.exit_code) == ("SUCCEEDED", 0), (status, await runtime.logs(back, both))
    raw = await runtime._rest(back).job(both)
    assert raw["start_time"] >= lost_at, raw           # Slurm ran it again, after the loss
    if lost == 1:      # requeued; a controller killed with the host may not have saved that it had started it
        assert raw["restart_cnt"] >= 1, raw

    again = await runtime.submit(back, job('echo "task on $(hostname)"', tasks=2, gpus=1))
    assert (await ended(runtime, back, again)).state == "SUCCEEDED"
    assert f"task on {name}" in await runtime.logs(back, again)


async def test_a_lost_node_taken_out_for_good_has_its_job_requeued_on_the_nodes_left(cluster):
    runtime, spec, handle, tenant, extra = cluster
    release = Path(handle.details["jobs_dir"]) / "release"
    wait = f"while [ ! -e {release} ]; do sleep 0.1; done"
    first, second = [await runtime.submit(handle, job(wait, gpus=1)) for _ in range(2)]    # one on each node
    statuses = await eventually(lambda: _both(runtime, handle, first, second), timeout=JOB_TIMEOUT,
                                until=lambda ss: all(s.state == "RUNNING" for s in ss))
    on_lost = first if statuses[0].nodes == ("hpc-1",) else second
    lose(spec.nodes[1].netns)
    smaller = await runtime.set_nodes(replace(spec, nodes=spec.nodes[:1]), handle)

    assert [n.name for n in await runtime.nodes(smaller)] == ["hpc-0"]
    assert (await runtime.job(smaller, on_lost)).state in ("PENDING", "RUNNING")
    release.touch()
    status = await ended(runtime, smaller, on_lost)
    assert (status.state, status.nodes) == ("SUCCEEDED", ("hpc-0",)), status
    assert (await runtime._rest(smaller).job(on_lost))["restart_cnt"] >= 1


async def _both(runtime, handle, a, b):
    return [await runtime.job(handle, a), await runtime.job(handle, b)]
