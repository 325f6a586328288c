"""The Slurm driver's rendered files: every path per cluster, every node with its address and GPUs."""
from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from services.paas.adapters.slurm.config import ClusterFiles, gpu_files, gres_conf, slurm_conf
from services.paas.domain.runtime import ClusterNode, ClusterSpec


def spec(*nodes: ClusterNode) -> ClusterSpec:
    return ClusterSpec(cluster_id=uuid.uuid4(), tenant_id=uuid.uuid4(), name="train", kind="slurm", nodes=nodes)


def node(i: int, gpus: int = 1, devices: tuple[str, ...] = ()) -> ClusterNode:
    return ClusterNode(name=f"train-{i}", allocation_id=uuid.uuid4(), address=f"10.1.0.{i + 1}", netns=f"ns{i}",
                       gpus=gpus, gpu_devices=devices, cpus=4, memory_mb=8000)


def settings(text: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            found.setdefault(key, []).append(value)
    return found


def test_the_controller_is_the_first_node_on_its_tenant_address_and_every_node_is_listed():
    files = ClusterFiles(Path("/state/c1"))
    conf = settings(slurm_conf(spec(node(0), node(1, gpus=2)), files))
    assert conf["ClusterName"] == ["train"]
    assert conf["SlurmctldHost"] == ["train-0(10.1.0.1)"]
    assert conf["NodeName"] == ["train-0 NodeAddr=10.1.0.1 NodeHostname=train-0 CPUs=4 RealMemory=8000 Gres=gpu:1 State=UNKNOWN",
                                "train-1 NodeAddr=10.1.0.2 NodeHostname=train-1 CPUs=4 RealMemory=8000 Gres=gpu:2 State=UNKNOWN"]
    assert conf["PartitionName"][0].startswith("tessera Nodes=train-0,train-1 Default=YES")


def test_every_path_and_key_is_the_clusters_own():
    conf = settings(slurm_conf(spec(node(0)), ClusterFiles(Path("/state/c1"))))
    assert conf["AuthInfo"] == ["socket=/state/c1/munge/munge.socket"]
    assert conf["AuthAltTypes"] == ["auth/jwt"] and conf["AuthAltParameters"] == ["jwt_key=/state/c1/ctld/jwt_hs256.key"]
    for key in ("StateSaveLocation", "SlurmctldPidFile", "SlurmdPidFile", "SlurmctldLogFile", "SlurmdLogFile"):
        assert conf[key][0].startswith("/state/c1/"), key
    assert conf["SlurmdSpoolDir"] == [f"{ClusterFiles(Path('/state/c1')).spool_link}/%n"]   # a link to its spool
    assert "%n" in conf["SlurmdSpoolDir"][0] and "%n" in conf["SlurmdPidFile"][0] and "%n" in conf["SlurmdLogFile"][0]


def test_a_cpu_node_has_no_gres_and_no_gres_line():
    s = spec(node(0, gpus=0), node(1, gpus=1))
    assert "Gres=" not in slurm_conf(s, ClusterFiles(Path("/s"))).splitlines()[-3]
    assert gres_conf(s) == "NodeName=train-1 Name=gpu File=/dev/null\n"


def test_gpus_map_to_their_device_files_else_to_character_device_stand_ins():
    assert gres_conf(spec(node(0, gpus=2, devices=("/dev/nvidia0", "/dev/nvidia1")))).splitlines() == [
        "NodeName=train-0 Name=gpu File=/dev/nvidia0", "NodeName=train-0 Name=gpu File=/dev/nvidia1"]
    assert gpu_files(node(0, gpus=2)) == ("/dev/null", "/dev/zero")
    with pytest.raises(ValueError):
        gpu_files(node(0, gpus=64))


def test_a_job_steps_socket_fits_a_unix_socket_path_with_the_longest_cluster_name_there_is():
    """``<spool>/<node>/<node>_<job>.<step>``: a socket path holds at most 107 bytes. The state directory is long
    (``/tmp/tessera-paas-<hash>/slurm/<cluster id>``): slurmd is given a short link to the spool instead."""
    files = ClusterFiles(Path("/tmp/tessera-paas-53749f22d7f5/slurm") / str(uuid.uuid4()))
    longest = "c" * 31 + "-63"                       # a 31-character cluster name, its 64th node
    step = f"{files.spool_link}/{longest}/{longest}_{99_999_999}.{4294967291}"   # a batch step of job 99,999,999
    assert len(step.encode()) <= 107, (len(step), step)
    assert len(f"{files.spool}/{longest}/{longest}_1.4294967291") > 107    # the state directory's own path would not
