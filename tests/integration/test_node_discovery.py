"""Hardware discovery on the node-agent: the sim topology, and NVML discovery on a host with and without GPUs.

The NVML tests read a sysfs tree built in a temporary directory and drive discovery
with a stand-in for the pynvml module shaped like the real one; the test that runs
the real pynvml shows that this machine (no NVIDIA driver) gets a clean, named
refusal, never a traceback or an empty node.
"""
from __future__ import annotations

import types
from pathlib import Path

import pytest

from services.node_agent.adapters.discovery import DiscoveryError, NvmlUnavailable, discover_nvml, discovery_from_env
from services.scheduler.contracts.topology import NodeTopology


def test_nvml_discovery_on_a_host_without_an_nvidia_driver_fails_cleanly():
    with pytest.raises(NvmlUnavailable, match="NVML cannot start on this host"):
        discover_nvml()


def test_auto_discovery_without_a_gpu_falls_back_to_the_sim_topology():
    name, discover = discovery_from_env({})
    doc = discover("node-a")
    topo = NodeTopology.from_dict(doc)
    assert name == "auto" and len(topo.gpus) == 8 and {g.numa for g in topo.gpus} == {0, 1}


def test_explicit_nvml_discovery_without_a_driver_is_refused_not_simulated():
    _, discover = discovery_from_env({"TESSERA_NODE_DISCOVERY": "nvml"})
    with pytest.raises(NvmlUnavailable):
        discover("node-a")


@pytest.mark.parametrize("env,match", [({"TESSERA_NODE_DISCOVERY": "magic"}, "not a discovery"),
                                       ({"TESSERA_NODE_DISCOVERY": "sim", "TESSERA_SIM_TOPOLOGY": "dgx-z9"}, "unknown sim")])
def test_a_bad_discovery_setting_names_the_variable(env, match):
    with pytest.raises(DiscoveryError, match=match):
        discovery_from_env(env)[1]("node-a")


class FakeNvml(types.SimpleNamespace):
    """Shaped like pynvml: 4 GPUs, 0-1 and 2-3 joined by NVLink bridges, GPU 3 not MIG-capable."""

    class NVMLError(Exception):
        pass

    NVML_NVLINK_MAX_LINKS = 2
    BUS = ("00000000:1B:00.0", "00000000:43:00.0", "00000000:9D:00.0", "00000000:C3:00.0")

    def __init__(self, links=((1,), (0,), (3,), (2,))):
        super().__init__(links=links, shutdown=False)

    def nvmlInit(self): pass
    def nvmlShutdown(self): self.shutdown = True
    def nvmlDeviceGetCount(self): return len(self.BUS)
    def nvmlDeviceGetHandleByIndex(self, i): return i
    def nvmlDeviceGetName(self, h): return b"NVIDIA H100 80GB HBM3"
    def nvmlDeviceGetPciInfo(self, h): return types.SimpleNamespace(busId=self.BUS[h].encode())
    def nvmlDeviceGetMemoryInfo(self, h): return types.SimpleNamespace(total=80 * 2**30)

    def nvmlDeviceGetMigMode(self, h):
        if h == 3:
            raise self.NVMLError("Not Supported")
        return (0, 0)

    def nvmlDeviceGetNvLinkState(self, h, link):
        return link < len(self.links[h])

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h, link):
        return types.SimpleNamespace(busId=self.BUS[self.links[h][link]])


def _sysfs(root: Path) -> Path:
    for i, pci in enumerate(["0000:1b:00.0", "0000:43:00.0", "0000:9d:00.0", "0000:c3:00.0"]):
        d = root / "bus/pci/devices" / pci
        d.mkdir(parents=True)
        (d / "numa_node").write_text("0\n" if i < 2 else "1\n")
    for n, cpus in ((0, "0-27,56-83"), (1, "28-55,84-111")):
        node = root / f"devices/system/node/node{n}"
        node.mkdir(parents=True)
        (node / "cpulist").write_text(cpus)
        (node / "meminfo").write_text(f"Node {n} MemTotal:       {512 * 2**20} kB\n")
    pf = root / "bus/pci/devices/0000:18:00.0"
    pf.mkdir(parents=True)
    vf = root / "bus/pci/devices/0000:18:00.1"
    vf.mkdir(parents=True)
    (vf / "numa_node").write_text("0")
    (vf / "physfn").symlink_to(pf)
    ib = root / "class/infiniband/mlx5_4"
    ib.mkdir(parents=True)
    (ib / "device").symlink_to(vf)
    (ib / "node_guid").write_text("b8ce:f603:00aa:0001")
    return root


def test_nvml_discovery_groups_nvlink_domains_and_reads_numa_from_sysfs(tmp_path):
    nvml = FakeNvml()
    doc = discover_nvml(nvml, _sysfs(tmp_path))
    topo = NodeTopology.from_dict(doc)
    assert [(g.pci, g.numa, g.nvlink_domain, g.mig_capable) for g in topo.gpus] == [
        ("0000:1b:00.0", 0, 0, True), ("0000:43:00.0", 0, 0, True),
        ("0000:9d:00.0", 1, 1, True), ("0000:c3:00.0", 1, 1, False)]
    assert {g.model for g in topo.gpus} == {"H100"} and topo.gpus[0].memory_gb == 80
    assert [(n.id, n.cpu_cores, n.memory_gb) for n in topo.numa_nodes] == [(0, 56, 512), (1, 56, 512)]
    assert [(v.pci, v.guid, v.numa, v.hca) for v in topo.ib_vfs] == [("0000:18:00.1", "b8ce:f603:00aa:0001", 0, "0000:18:00.0")]
    assert nvml.shutdown


def test_gpus_behind_one_nvswitch_share_one_domain(tmp_path):
    nvml = FakeNvml(links=((9,), (9,), (9,), ()))
    nvml.BUS = (*FakeNvml.BUS, "00000000:FF:00.0")          # index 9 is out of range: stands for the switch
    nvml.nvmlDeviceGetCount = lambda: 4
    nvml.nvmlDeviceGetNvLinkRemotePciInfo = lambda h, link: types.SimpleNamespace(busId="00000000:F0:00.0")
    doc = discover_nvml(nvml, _sysfs(tmp_path))
    assert [g["nvlink_domain"] for g in doc["gpus"]] == [0, 0, 0, 1]


def test_nvml_reporting_no_gpu_is_unavailable_not_an_empty_node(tmp_path):
    nvml = FakeNvml()
    nvml.nvmlDeviceGetCount = lambda: 0
    with pytest.raises(NvmlUnavailable, match="no GPU"):
        discover_nvml(nvml, _sysfs(tmp_path))
    assert nvml.shutdown
