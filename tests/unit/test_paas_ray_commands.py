"""The Ray daemons' command lines: on their node, bound to its tenant address, with short temp dirs (pure)."""
from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from services.paas.adapters.ray import commands
from services.paas.domain.runtime import ClusterError, ClusterNode

VENV = Path("/opt/ray-venv")
CLUSTER = uuid.UUID(int=1)


def node(name: str, address: str, netns: str | None = "ts-0a1b2c3d-0123456789ab") -> ClusterNode:
    return ClusterNode(name=name, allocation_id=uuid.uuid4(), address=address, netns=netns, gpus=2, cpus=4,
                       memory_mb=1024)


def test_the_head_runs_in_its_slot_on_its_tenant_address_with_its_gpus_and_a_small_object_store():
    head = node("c-0", "10.1.0.10")
    argv = commands.head_argv(VENV, head, Path("/tmp/t"))
    assert argv[:5] == ["ip", "netns", "exec", head.netns, "/opt/ray-venv/bin/ray"]
    for flag in ("--head", "--block", "--port=6379", "--dashboard-host=10.1.0.10", "--dashboard-port=8265",
                 "--node-ip-address=10.1.0.10", "--num-gpus=2", "--num-cpus=4", "--temp-dir=/tmp/t",
                 "--disable-usage-stats", f"--object-store-memory={75 * 1024 * 1024}"):
        assert flag in argv


def test_a_worker_joins_the_heads_gcs_and_the_api_bridge_is_a_private_unix_socket():
    head, worker = node("c-0", "10.1.0.10"), node("c-1", "10.1.0.11", "ts-x-1")
    argv = commands.worker_argv(VENV, worker, head, Path("/tmp/t"))
    assert argv[3] == "ts-x-1" and "--address=10.1.0.10:6379" in argv and "--head" not in argv
    bridge = commands.api_bridge_argv(head, Path("/s/api.sock"))
    assert bridge[4:] == ["socat", "UNIX-LISTEN:/s/api.sock,fork,mode=600,unlink-early", "TCP:10.1.0.10:8265"]


def test_a_node_without_a_namespace_is_refused_for_good():
    with pytest.raises(ClusterError) as err:
        commands.head_argv(VENV, node("c-0", "10.1.0.10", None), Path("/tmp/t"))
    assert err.value.permanent


def test_temp_dirs_are_short_one_per_node_and_refused_when_too_long_for_rays_sockets():
    a, b = (commands.node_temp_dir(Path("/tmp"), CLUSTER, n) for n in ("c-0", "c-1"))
    assert a != b and a.parent == b.parent == commands.cluster_temp_root(Path("/tmp"), CLUSTER)
    assert len(str(a)) <= commands.MAX_TEMP_DIR
    with pytest.raises(ClusterError):
        commands.node_temp_dir(Path("/" + "x" * 40), CLUSTER, "c-0")


def test_the_daemons_environment_puts_rays_venv_first_and_marks_the_cluster_and_node():
    env = commands.daemon_env(VENV, CLUSTER, "c-1")
    assert env["PATH"].startswith("/opt/ray-venv/bin:") and env["RAY_USAGE_STATS_ENABLED"] == "0"
    assert env[commands.CLUSTER_MARK] == str(CLUSTER) and env[commands.NODE_MARK] == "c-1"
