"""Topologies, derived slot maps and re-discovery comparison (pure domain, no I/O)."""
from __future__ import annotations

import dataclasses

import pytest

from services.node_agent.adapters.discovery.sim import SIM_KINDS, sim_topology
from services.scheduler.domain.topology import (
    Gpu,
    IbVf,
    NodeTopology,
    NumaNode,
    Nvme,
    SlotMap,
    TopologyError,
    compare,
    derive_slot_map,
)


@pytest.mark.parametrize("kind, gpus, model, groups", [
    ("hgx-h100-8", 8, "H100", {(0, 0): 4, (1, 0): 4}),
    ("hgx-a100-8", 8, "A100", {(0, 0): 4, (1, 0): 4}),
    ("pcie-l40s-4", 4, "L40S", {(0, 0): 2, (1, 1): 2}),
])
def test_each_sim_kind_derives_one_numa_local_slot_per_gpu(kind, gpus, model, groups):
    topo = sim_topology("node-a", kind)
    slot_map, problems = derive_slot_map(topo)
    assert problems == []
    assert len(slot_map.slots) == gpus and all(s.gpu_model == model for s in slot_map.slots)
    nvme_numa = {n.pci: n.numa for n in topo.nvmes}
    vf_numa = {v.pci: v.numa for v in topo.ib_vfs}
    for s in slot_map.slots:
        assert s.index == s.gpu_index
        assert nvme_numa[s.nvme_pci] == s.numa and vf_numa[s.ib_vf_pci] == s.numa
    seen: dict[tuple[int, int], int] = {}
    for s in slot_map.slots:
        seen[(s.numa, s.nvlink_domain)] = seen.get((s.numa, s.nvlink_domain), 0) + 1
    assert seen == groups
    assert len({s.nvme_pci for s in slot_map.slots}) == gpus and len({s.ib_vf_pci for s in slot_map.slots}) == gpus


def test_hgx_h100_splits_each_numa_nodes_cores_and_memory_evenly_among_its_gpus():
    slot_map, _ = derive_slot_map(sim_topology("node-a", "hgx-h100-8"))
    assert {(s.cpu_cores, s.memory_gb) for s in slot_map.slots} == {(112 // 4, 1024 // 4)}
    assert all(s.wipe_policy == "nvme-secure-erase" and s.mig_capable for s in slot_map.slots)


def test_sim_topology_is_deterministic_per_name_and_distinct_across_names():
    a1, a2, b = sim_topology("node-a"), sim_topology("node-a"), sim_topology("node-b")
    assert a1 == a2
    assert {g.pci for g in a1.gpus}.isdisjoint({g.pci for g in b.gpus})
    assert {v.guid for v in a1.ib_vfs}.isdisjoint({v.guid for v in b.ib_vfs})


def test_unknown_sim_kind_is_refused_naming_the_known_ones():
    with pytest.raises(TopologyError, match="hgx-h100-8"):
        sim_topology("n", "dgx-z9000")
    assert set(SIM_KINDS) >= {"hgx-h100-8", "hgx-a100-8", "pcie-l40s-4"}


def test_topology_and_slot_map_round_trip_through_dicts():
    topo = sim_topology("node-a", "pcie-l40s-4")
    assert NodeTopology.from_dict(topo.to_dict()) == topo
    slot_map, _ = derive_slot_map(topo, wipe_policy=None)
    assert SlotMap.from_dict(slot_map.to_dict()) == slot_map


def test_a_gpu_without_an_nvme_on_its_numa_node_gets_no_slot_and_is_reported():
    topo = sim_topology("node-a")
    short = dataclasses.replace(topo, nvmes=tuple(n for n in topo.nvmes if n.index != 7))
    slot_map, problems = derive_slot_map(short)
    assert len(slot_map.slots) == 7 and 7 not in {s.index for s in slot_map.slots}
    assert len(problems) == 1 and "GPU 7" in problems[0] and "NVMe" in problems[0]


def test_an_nvme_on_the_other_numa_node_is_not_borrowed():
    numa = (NumaNode(0, 8, 64), NumaNode(1, 8, 64))
    topo = NodeTopology((Gpu(0, "H100", "0000:01:00.0", 0, 0, 80),),
                        (Nvme(0, "0000:81:00.0", 1, 100),),
                        (IbVf(0, "0000:02:00.1", "g0", 0, "mlx5_0"),), numa)
    slot_map, problems = derive_slot_map(topo)
    assert slot_map.slots == () and "GPU 0" in problems[0]


def test_slots_without_a_wipe_policy_are_not_schedulable():
    slot_map, _ = derive_slot_map(sim_topology("node-a"), wipe_policy=None)
    assert len(slot_map.slots) == 8 and slot_map.schedulable_slots == ()
    empty, _ = derive_slot_map(sim_topology("node-a"), wipe_policy="")
    assert empty.schedulable_slots == ()


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["gpus"][0].pop("pci"), "gpus\\[0\\]"),
    (lambda d: d["gpus"][1].update(numa=5), "NUMA node 5"),
    (lambda d: d["nvmes"][1].update(pci=d["nvmes"][0]["pci"]), "duplicate NVMe pci"),
    (lambda d: d["numa_nodes"][0].update(cpu_cores="many"), "cpu_cores: expected int"),
    (lambda d: d["ib_vfs"][0].update(color="red"), "unknown field"),
    (lambda d: d.update(gpus="eight"), "topology.gpus: expected a list"),
])
def test_malformed_topology_documents_are_refused_with_a_precise_message(mutate, message):
    doc = sim_topology("node-a").to_dict()
    mutate(doc)
    with pytest.raises(TopologyError, match=message):
        NodeTopology.from_dict(doc)


def test_rediscovery_of_the_same_hardware_matches_the_approved_map():
    approved, _ = derive_slot_map(sim_topology("node-a"))
    assert compare(approved, sim_topology("node-a")) == []


def test_rediscovery_with_a_gpu_missing_names_the_missing_gpu():
    approved, _ = derive_slot_map(sim_topology("node-a"))
    topo = sim_topology("node-a")
    lost = topo.gpus[3]
    diff = compare(approved, dataclasses.replace(topo, gpus=tuple(g for g in topo.gpus if g is not lost)))
    assert diff == [f"slot 3: GPU {lost.pci} missing"]


def test_rediscovery_with_a_gpu_moved_to_another_numa_node_is_a_difference():
    approved, _ = derive_slot_map(sim_topology("node-a"))
    topo = sim_topology("node-a")
    moved = tuple(dataclasses.replace(g, numa=1) if g.index == 0 else g for g in topo.gpus)
    diff = compare(approved, dataclasses.replace(topo, gpus=moved))
    assert len(diff) == 1 and "NUMA node changed from 0 to 1" in diff[0]


def test_rediscovery_reports_a_missing_vf_and_a_new_gpu():
    approved, _ = derive_slot_map(sim_topology("node-a", "pcie-l40s-4"))
    topo = sim_topology("node-a", "pcie-l40s-4")
    extra = Gpu(9, "L40S", "ffff:99:00.0", 0, 0, 48)
    changed = dataclasses.replace(topo, gpus=(*topo.gpus, extra), ib_vfs=topo.ib_vfs[1:])
    diff = compare(approved, changed)
    assert any("IB VF" in d and "missing" in d for d in diff)
    assert any("ffff:99:00.0" in d and "new" in d for d in diff)
    assert len(diff) == 2
