"""Ray's node records, per-node usage and jobs, as the NodeUse words scale-in reads (pure)."""
from __future__ import annotations

from services.paas.adapters.ray.usage import node_uses

ADDRESSES = {"c-0": "10.0.0.10", "c-1": "10.0.0.11", "c-2": "10.0.0.12"}


def node(node_id: str, ip: str, state: str = "ALIVE") -> dict:
    return {"node_id": node_id, "node_ip": ip, "state": state}


def words(ray_nodes, usage=None, jobs=(), drains=()) -> list[tuple[str, str, int, int]]:
    return [(u.name, u.state, u.running_jobs, u.gpus_in_use)
            for u in node_uses(ADDRESSES, ray_nodes, usage or {}, list(jobs), set(drains))]


def test_idle_mixed_allocated_and_down_from_gpu_use_and_running_drivers():
    usage = {"a": {"GPU": [0.0, 2.0]}, "b": {"GPU": [1.0, 2.0]}}
    jobs = [{"status": "RUNNING", "driver_node_id": "a"}, {"status": "SUCCEEDED", "driver_node_id": "b"}]
    assert words([node("a", "10.0.0.10"), node("b", "10.0.0.11")], usage, jobs) == [
        ("c-0", "mixed", 1, 0), ("c-1", "mixed", 0, 1), ("c-2", "down", 0, 0)]
    assert words([node("a", "10.0.0.10")], {"a": {"GPU": [2.0, 2.0]}})[0] == ("c-0", "allocated", 0, 2)
    assert words([node("a", "10.0.0.10")])[0] == ("c-0", "idle", 0, 0)


def test_a_drained_node_reads_draining_while_its_raylet_lives_and_drained_once_it_left():
    assert words([node("b", "10.0.0.11")], drains=["c-1"])[1][1] == "draining"
    assert words([node("b", "10.0.0.11", "DEAD")], drains=["c-1"])[1][1] == "drained"


def test_a_node_restarted_at_its_address_is_its_alive_record_not_the_dead_one():
    ray_nodes = [node("new", "10.0.0.11"), node("old", "10.0.0.11", "DEAD")]
    assert words(ray_nodes, {"new": {"GPU": [1.0, 1.0]}})[1] == ("c-1", "allocated", 0, 1)
