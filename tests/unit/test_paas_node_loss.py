"""A cluster's node lost with its host (pure): lost, back in either order, not replaced, and its jobs' fate."""
from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime

import pytest

from services.paas.adapters.kubernetes.applier import RecordingApplier
from services.paas.adapters.kubernetes.runtime import KubernetesRuntime
from services.paas.adapters.ray.runtime import RayRuntime
from services.paas.domain.clusters import Cluster, lost_job
from services.paas.domain.runtime import ClusterError, ClusterHandle, ClusterNode, ClusterSpec
from services.paas.handlers.recover import on_away_node


def cluster(n: int = 3, state: str = "ready", kind: str = "slurm") -> Cluster:
    now = datetime.now(UTC)
    cl = Cluster(uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), "hpc", kind, "vm.1gpu", 1, n, None, None, 0, False, None,
                 state, now, now, handle={"nodes": [f"hpc-{i}" for i in range(n)]} if state != "starting" else None)
    for i, m in enumerate(cl.add_gang(n)):
        m.state, m.address, m.node_id, m.attachment_id = "ready", f"10.0.0.{i + 1}", uuid.uuid4(), uuid.uuid4()
    return cl


def test_a_lost_node_stays_a_node_of_the_cluster_which_says_which_and_why():
    cl = cluster()
    m = cl.members[1]
    assert cl.lose(m, "node_lost: gone")
    assert (m.state, m.address, m.node_id, m.attachment_id) == ("lost", None, None, None)
    assert m in cl.live_members and not cl.settled and not cl.all_active
    assert (cl.state, cl.reason) == ("scaling", "node hpc-1 lost: node_lost: gone; waiting for it on another node")
    assert not cl.lose(m, "again")            # a redelivery changes nothing


def test_back_needs_both_the_new_node_and_the_new_address_in_either_order():
    for first in ("address", "node"):
        cl = cluster()
        m = cl.members[2]
        cl.lose(m, "x")
        if first == "address":
            m.address = "10.0.0.9"
        else:
            m.node_id = uuid.uuid4()
        assert not cl.back(m) and m.state == "lost"
        m.address, m.node_id = m.address or "10.0.0.9", m.node_id or uuid.uuid4()
        assert cl.back(m) and m.state == "rejoining" and cl.state == "scaling"


def test_a_node_lost_before_the_cluster_started_is_waited_for_as_a_first_node():
    cl = cluster(2, state="starting")
    cl.lose(cl.members[0], "x")
    assert cl.state == "provisioning"
    cl.members[0].address, cl.members[0].node_id = "10.0.0.7", uuid.uuid4()
    assert cl.back(cl.members[0]) and cl.members[0].state == "active" and cl.state == "starting"


def test_nothing_is_lost_from_a_cluster_going_away_nor_a_node_already_leaving():
    cl = cluster(state="deleting")
    assert not cl.lose(cl.members[1], "x")
    cl = cluster()
    cl.members[2].state = "draining"
    assert not cl.lose(cl.members[2], "x")


def test_not_replaced_shrinks_the_cluster_or_fails_it_for_the_controller():
    cl = cluster()
    cl.lose(cl.members[2], "x")
    cl.not_replaced(cl.members[2], "no room")
    assert (cl.members[2].state, cl.node_count, cl.state) == ("failed", 2, "scaling")
    assert cl.reason == "node hpc-2 lost and not replaced: no room; the cluster goes on with 2 node(s)"
    cl = cluster()
    cl.lose(cl.members[0], "x")
    cl.not_replaced(cl.members[0], "no room")
    assert cl.state == "deleting" and cl.reason.startswith("node hpc-0 (the controller) lost and not replaced")


def test_a_job_on_a_lost_node_is_requeued_except_a_ray_job_whose_driver_died():
    assert lost_job("slurm", "hpc-1", "node_lost: gone") == ("PENDING", "requeued: node hpc-1 lost (node_lost: gone)")
    assert lost_job("kubernetes", "k-1", "x")[0] == "PENDING"
    state, reason = lost_job("ray", "r-1", "x")
    assert state == "FAILED" and "driver died" in reason


def test_a_job_is_left_alone_only_while_a_node_it_ran_on_is_away():
    cl = cluster()
    job = {"nodes": ["hpc-0", "hpc-1"]}
    assert not on_away_node(cl, job)
    cl.lose(cl.members[1], "x")
    assert on_away_node(cl, job) and not on_away_node(cl, {"nodes": ["hpc-2"]})
    cl.members[1].state = "ready"
    assert not on_away_node(cl, job)


async def test_kubernetes_records_a_join_of_the_lost_worker_and_refuses_to_move_the_control_plane(tmp_path):
    runtime = KubernetesRuntime(tmp_path, RecordingApplier(tmp_path))
    nodes = tuple(ClusterNode(f"k-{i}", uuid.uuid4(), f"10.0.0.{i + 2}", gpus=1) for i in range(2))
    spec = ClusterSpec(uuid.uuid4(), uuid.uuid4(), "k", "kubernetes", nodes)
    handle = await runtime.start(spec)
    moved = dataclasses.replace(nodes[1], address="10.0.0.9")
    moved_spec = dataclasses.replace(spec, nodes=(nodes[0], moved))
    await runtime.replace_node(moved_spec, handle, moved)
    runs = [(c["node"], c["argv"][:3]) for c in runtime.applier.calls(str(spec.cluster_id)) if c["call"] == "run"]
    assert runs[-2:] == [("k-0", ["kubectl", "delete", "node"]), ("k-1", ["kubeadm", "join", "--config"])]
    joined = runtime.applier.calls(str(spec.cluster_id))[-1]["documents"][0]
    assert {"name": "node-ip", "value": "10.0.0.9"} in joined["nodeRegistration"]["kubeletExtraArgs"], joined
    with pytest.raises(ClusterError) as refused:
        await runtime.replace_node(moved_spec, handle, nodes[0])
    assert refused.value.permanent and "etcd" in str(refused.value)


async def test_ray_refuses_to_move_its_head(tmp_path):
    node = ClusterNode("r-0", uuid.uuid4(), "10.0.0.2", gpus=1)
    spec = ClusterSpec(uuid.uuid4(), uuid.uuid4(), "r", "ray", (node,))
    handle = ClusterHandle(spec.cluster_id, "10.0.0.2:6379", "unix:/nowhere", "ray", {"head": "r-0", "nodes": {}})
    with pytest.raises(ClusterError) as refused:
        await RayRuntime(tmp_path).replace_node(spec, handle, node)
    assert refused.value.permanent and "head node r-0 was lost" in str(refused.value)


def test_only_a_running_job_is_requeued_and_a_poll_never_takes_it_back():
    from services.paas.domain.jobs import IllegalTransition, Lifecycle

    requeued = Lifecycle("RUNNING").requeued("requeued: node hpc-1 lost (node_lost: heartbeat)")
    assert (requeued.state, requeued.reason) == ("PENDING", "requeued: node hpc-1 lost (node_lost: heartbeat)")
    for state in ("SUBMITTING", "PENDING", "CANCELLING", "SUCCEEDED", "FAILED", "REJECTED"):
        with pytest.raises(IllegalTransition):
            Lifecycle(state, "x" if state == "REJECTED" else "").requeued("lost")
    with pytest.raises(IllegalTransition):
        Lifecycle("RUNNING").to("PENDING")
    assert Lifecycle("RUNNING").observed("PENDING").state == "RUNNING"   # a lagging read, not a requeue
