"""The libvirt domain XML of a VM slice (pure), its sizing from slots, and the host facts read from sysfs."""
from __future__ import annotations

import dataclasses
import uuid
import xml.etree.ElementTree as ET

import pytest

from services.node_agent.adapters.discovery.sim import sim_topology
from services.node_agent.adapters.drivers.libvirt.host import (
    hugepages_1g,
    numa_cpus,
    parse_cpulist,
    sim_numa_cpus,
)
from services.node_agent.domain.vm.domain_xml import (
    TESSERA_NS,
    BootFiles,
    DomainSpec,
    Nic,
    SlotDevices,
    domain_name,
    domain_xml,
    fit_to_host,
    ib_vf_mac,
    parse_metadata,
    pin_cpus,
    slot_resources,
)
from services.scheduler.domain.topology import derive_slot_map

SLOT0 = SlotDevices(0, "1a2b:1b:00.0", "1a2b:0c:00.0", "1a2b:18:00.1", "1a2b:3c4d:5e6f:7a00", 0, 2, 4)
SLOT1 = SlotDevices(1, "1a2b:43:00.0", "1a2b:0d:00.0", "1a2b:40:00.1", "1a2b:3c4d:5e6f:7a01", 0, 2, 4)


def spec(**over) -> DomainSpec:
    base = dict(name=domain_name(uuid.uuid4()), uuid=str(uuid.uuid4()), domain_type="kvm", memory_mib=8192, vcpus=4,
                cpuset=(4, 5, 6, 7), emulator_cpuset=(4, 5, 6, 7), numa_node=0, hugepages_1g=False, slots=(SLOT0, SLOT1),
                passthrough=True, nic=Nic("52:54:00:12:34:56", "tap-a1", "br-t1"), disk="/var/lib/tessera/a.qcow2",
                seed_iso="/var/lib/tessera/a-seed.iso", boot=None, console_log="/var/log/tessera/a.log",
                console_socket=None, metadata={"allocation_id": "a1", "tenant_id": "t1"})
    return DomainSpec(**{**base, **over})


def parsed(s: DomainSpec) -> ET.Element:
    return ET.fromstring(domain_xml(s))


def pci(el: ET.Element) -> str:
    a = el.find("source/address")
    return f"{a.get('domain')[2:]}:{a.get('bus')[2:]}:{a.get('slot')[2:]}.{a.get('function')[2:]}"


def test_each_vcpu_is_pinned_to_its_own_host_cpu_and_the_emulator_to_the_set():
    root = parsed(spec(cpuset=(9, 4, 5, 6), emulator_cpuset=(4, 5, 6, 9)))
    assert root.find("vcpu").attrib == {"placement": "static"} and root.find("vcpu").text == "4"
    assert [(p.get("vcpu"), p.get("cpuset")) for p in root.findall("cputune/vcpupin")] == \
        [("0", "9"), ("1", "4"), ("2", "5"), ("3", "6")]
    assert root.find("cputune/emulatorpin").get("cpuset") == "4-6,9"


def test_memory_is_bound_strictly_to_the_numa_node_and_written_in_mib():
    root = parsed(spec(numa_node=1))
    assert root.find("numatune/memory").attrib == {"mode": "strict", "nodeset": "1"}
    assert root.find("memory").attrib == {"unit": "MiB"} and root.find("memory").text == "8192"


def test_without_cpuset_numa_node_or_hugepages_there_is_no_tuning():
    root = parsed(spec(cpuset=(), emulator_cpuset=(), numa_node=None, hugepages_1g=False))
    assert root.find("cputune") is None and root.find("numatune") is None and root.find("memoryBacking") is None


def test_one_gib_hugepages_back_the_memory_only_when_asked():
    assert parsed(spec()).find("memoryBacking") is None
    page = parsed(spec(hugepages_1g=True)).find("memoryBacking/hugepages/page")
    # a page's nodeset would name guest NUMA cells: the host node comes from numatune
    assert page.attrib == {"size": "1", "unit": "GiB"}


def test_hugepages_need_whole_gib_of_memory():
    with pytest.raises(ValueError, match="huge pages"):
        spec(hugepages_1g=True, memory_mib=1536)


def test_passthrough_writes_each_slots_gpu_nvme_and_ib_vf():
    devices = parsed(spec()).find("devices")
    hostdevs = devices.findall("hostdev")
    assert [pci(h) for h in hostdevs] == ["1a2b:1b:00.0", "1a2b:0c:00.0", "1a2b:43:00.0", "1a2b:0d:00.0"]
    for h in hostdevs:
        assert h.attrib == {"mode": "subsystem", "type": "pci", "managed": "yes"}
        assert h.find("driver").get("name") == "vfio"
    vfs = devices.findall("interface[@type='hostdev']")
    assert [pci(v) for v in vfs] == ["1a2b:18:00.1", "1a2b:40:00.1"]
    assert [v.find("mac").get("address") for v in vfs] == [ib_vf_mac(SLOT0.ib_guid), ib_vf_mac(SLOT1.ib_guid)]
    assert all(v.get("managed") == "yes" and v.find("source/address").get("type") == "pci" for v in vfs)


def test_without_passthrough_no_slot_device_is_written():
    devices = parsed(spec(passthrough=False)).find("devices")
    assert devices.findall("hostdev") == [] and devices.findall("interface[@type='hostdev']") == []


def test_kvm_passes_the_host_cpu_through_and_tcg_uses_qemus_richest_model():
    kvm = parsed(spec()).find("cpu")
    assert kvm.get("mode") == "host-passthrough" and kvm.find("maxphysaddr").get("mode") == "passthrough"
    assert parsed(spec(domain_type="qemu")).find("cpu").get("mode") == "maximum"
    assert parsed(spec(domain_type="qemu")).get("type") == "qemu"


def test_direct_kernel_boot_or_boot_from_disk():
    os_el = parsed(spec()).find("os")
    assert os_el.find("boot").get("dev") == "hd" and os_el.find("kernel") is None
    os_el = parsed(spec(boot=BootFiles("/k/vmlinuz", "/k/initrd.img", "console=ttyS0 quiet"), machine="pc")).find("os")
    assert [(e.tag, e.text) for e in os_el][1:] == [("kernel", "/k/vmlinuz"), ("initrd", "/k/initrd.img"),
                                                    ("cmdline", "console=ttyS0 quiet")]
    assert os_el.find("type").attrib == {"arch": "x86_64", "machine": "pc"} and os_el.find("boot") is None
    no_initrd = parsed(spec(boot=BootFiles("/k/vmlinuz", None, ""))).find("os")
    assert no_initrd.find("initrd") is None


def test_disks_are_a_virtio_overlay_and_a_readonly_ide_seed():
    disk, seed = parsed(spec()).findall("devices/disk")
    assert disk.attrib == {"type": "file", "device": "disk"} and disk.find("driver").get("type") == "qcow2"
    assert disk.find("source").get("file") == "/var/lib/tessera/a.qcow2"
    assert disk.find("target").attrib == {"dev": "vda", "bus": "virtio"}
    assert seed.get("device") == "cdrom" and seed.find("target").attrib == {"dev": "hdc", "bus": "ide"}
    assert seed.find("readonly") is not None and seed.find("driver").get("type") == "raw"
    assert len(parsed(spec(seed_iso=None)).findall("devices/disk")) == 1


def test_a_bridged_nic_names_its_bridge_and_an_unbridged_one_lets_libvirt_make_the_tap():
    bridged = parsed(spec()).find("devices/interface[@type='bridge']")
    assert bridged.find("source").get("bridge") == "br-t1" and bridged.find("target").attrib == {"dev": "tap-a1"}
    assert bridged.find("model").get("type") == "virtio" and bridged.find("mac").get("address") == "52:54:00:12:34:56"
    tap = parsed(spec(nic=Nic("52:54:00:12:34:57", "tap-a2", None))).find("devices/interface[@type='ethernet']")
    assert tap.find("target").attrib == {"dev": "tap-a2", "managed": "yes"} and tap.find("source") is None
    assert parsed(spec(nic=None)).findall("devices/interface[@type!='hostdev']") == []


def test_serial_console_goes_to_the_log_and_a_second_port_to_the_socket():
    devices = parsed(spec(console_socket="/run/tessera/a.sock")).find("devices")
    log, sock = devices.findall("serial")
    assert log.get("type") == "file" and log.find("source").attrib == {"path": "/var/log/tessera/a.log", "append": "on"}
    assert log.find("target").get("port") == "0"
    console = devices.find("console")
    assert console.find("source").get("path") == "/var/log/tessera/a.log"
    assert console.find("target").attrib == {"type": "serial", "port": "0"}
    assert sock.get("type") == "unix" and sock.find("source").attrib == {"mode": "bind", "path": "/run/tessera/a.sock"}
    assert sock.find("target").get("port") == "1"
    assert len(parsed(spec()).findall("devices/serial")) == 1
    assert parsed(spec()).find("devices/graphics") is None


def test_metadata_roundtrips_through_parse_metadata():
    meta = {"allocation_id": str(uuid.uuid4()), "tenant_id": "t9", "node_id": "node-a", "image": "ubuntu-24.04",
            "hostname": "gpu-1", "passthrough": "simulated", "empty": ""}
    xml = domain_xml(spec(metadata=meta))
    assert parse_metadata(xml) == meta
    assert ET.fromstring(xml).find(f"metadata/{{{TESSERA_NS}}}instance/{{{TESSERA_NS}}}tenant_id").text == "t9"


def test_a_domain_without_tesseras_metadata_is_foreign():
    assert parse_metadata("<domain type='kvm'><name>other</name></domain>") is None
    other_ns = "<domain><metadata><x:instance xmlns:x='https://example.com/ns'><x:a>1</x:a></x:instance></metadata></domain>"
    assert parse_metadata(other_ns) is None
    with pytest.raises(ValueError, match="not a domain XML"):
        parse_metadata("<domain>")


def test_odd_characters_are_escaped_and_come_back_unchanged():
    odd = "a&b<c>d\"e'f ]]> \t\n ünï 🚀 &amp;"
    s = spec(metadata={"hostname": odd}, boot=BootFiles("/k/a b&c", None, f"x='{odd}'"),
             console_log="/var/log/<odd>&'\".log")
    xml = domain_xml(s)
    assert "<c>" not in xml and "&b" not in xml
    root = ET.fromstring(xml)
    assert parse_metadata(xml) == {"hostname": odd}
    assert root.find("os/cmdline").text == f"x='{odd}'" and root.find("os/kernel").text == "/k/a b&c"
    assert root.find("devices/serial/source").get("path") == "/var/log/<odd>&'\".log"


@pytest.mark.parametrize("over, field", [
    ({"metadata": {"hostname": "a\x00b"}}, "metadata hostname"),
    ({"metadata": {"hostname": "a\rb"}}, "metadata hostname"),
    ({"metadata": {"1st": "x"}}, "metadata key"),
    ({"metadata": {"a b": "x"}}, "metadata key"),
    ({"metadata": {"xmlish": "x"}}, "metadata key"),
    ({"metadata": {"n": 1}}, "metadata n"),
    ({"boot": None, "console_log": "relative.log"}, "console_log"),
    ({"name": "a/b"}, "name"),
    ({"uuid": "nope"}, "uuid"),
    ({"domain_type": "xen"}, "domain_type"),
    ({"vcpus": 0, "cpuset": ()}, "vcpus"),
    ({"cpuset": (1, 2)}, "cpuset"),
    ({"cpuset": (1, 2, 3, -4)}, "host CPU"),
    ({"machine": "pc'><x"}, "machine"),
])
def test_malformed_specs_are_refused_naming_the_field(over, field):
    with pytest.raises(ValueError, match=field):
        spec(**over)


@pytest.mark.parametrize("build, field", [
    (lambda: SlotDevices(0, "0000:1b:00.8", "0000:0c:00.0", "0000:18:00.1", "1a2b:3c4d:5e6f:7a00", 0, 2, 4), "gpu_pci"),
    (lambda: SlotDevices(0, "0000:1b:00.0", "0:0c:00.0", "0000:18:00.1", "1a2b:3c4d:5e6f:7a00", 0, 2, 4), "nvme_pci"),
    (lambda: SlotDevices(0, "0000:1b:00.0", "0000:0c:00.0", "0000:18:00.1", "zz", 0, 2, 4), "ib_guid"),
    (lambda: SlotDevices(0, "0000:1b:00.0", "0000:0c:00.0", "0000:18:00.1", "1a2b:3c4d:5e6f:7a00", -1, 2, 4), "numa"),
    (lambda: Nic("52:54:00:12:34", "tap", None), "mac"),
    (lambda: Nic("52:54:00:12:34:56", "a-tap-name-too-long", None), "tap"),
    (lambda: Nic("52:54:00:12:34:56", "tap", "br/0"), "bridge"),
    (lambda: BootFiles("vmlinuz", None, ""), "kernel"),
])
def test_malformed_devices_are_refused_naming_the_field(build, field):
    with pytest.raises(ValueError, match=field):
        build()


def test_domain_name_is_tessera_and_the_allocation_hex():
    a = uuid.uuid4()
    assert domain_name(a) == domain_name(str(a)) == f"tessera-{a.hex}"


def test_ib_vf_mac_is_deterministic_unicast_and_locally_administered():
    mac = ib_vf_mac("1A2B:3C4D:5E6F:7A00")
    assert mac == ib_vf_mac("1a2b3c4d5e6f7a00") != ib_vf_mac("1a2b:3c4d:5e6f:7a01")
    first = int(mac[:2], 16)
    assert first & 0b10 and not first & 0b1
    with pytest.raises(ValueError):
        ib_vf_mac("1a2b:3c4d")


def test_pin_cpus_gives_each_slot_position_its_own_share_of_the_numa_node():
    node1 = tuple(range(8, 16))
    assert pin_cpus(node1, [0], 2) == (8, 9)
    assert pin_cpus(node1, [3, 1], 2) == (14, 15, 10, 11)


@pytest.mark.parametrize("positions, cores, message", [
    ([4], 2, "has only 8"), ([1], 5, "has only 8"), ([0, 0], 2, "repeat"), ([-1], 2, "position"), ([0], 0, "cores_per_slot"),
])
def test_pin_cpus_refuses_what_the_numa_node_cannot_give(positions, cores, message):
    with pytest.raises(ValueError, match=message):
        pin_cpus(tuple(range(8, 16)), positions, cores)


def hgx_slots() -> tuple[SlotDevices, ...]:
    slot_map, problems = derive_slot_map(sim_topology("node-a", "hgx-h100-8"))
    assert problems == []
    return tuple(SlotDevices.from_slot(s) for s in slot_map.slots)


def test_slot_resources_size_and_pin_an_allocation_on_one_numa_node():
    host = hgx_slots()
    cpus = sim_numa_cpus(sim_topology("node-a", "hgx-h100-8").numa_nodes)
    four = slot_resources(host[:4], host, cpus)
    assert (four.vcpus, four.memory_mib, four.numa_node) == (112, 4 * 256 * 1024, 0)
    assert four.cpuset == tuple(range(112)) and four.emulator_cpuset == tuple(range(112))
    one = slot_resources([host[5]], host, cpus)
    assert (one.vcpus, one.memory_mib, one.numa_node, one.cpuset) == (28, 256 * 1024, 1, tuple(range(140, 168)))


def test_slot_resources_across_numa_nodes_pin_each_vcpu_to_its_slots_node_without_numatune():
    host = hgx_slots()
    span = slot_resources([host[4], host[3]], host, sim_numa_cpus(sim_topology("n", "hgx-h100-8").numa_nodes))
    assert span.numa_node is None and span.cpuset == tuple(range(84, 112)) + tuple(range(112, 140))


def test_slot_resources_refuse_unknown_slots_and_hosts_without_the_cpus():
    host = hgx_slots()
    cpus = sim_numa_cpus(sim_topology("node-a", "hgx-h100-8").numa_nodes)
    with pytest.raises(ValueError, match="not in the host's slot map"):
        slot_resources([dataclasses.replace(host[0], numa=1)], host, cpus)
    with pytest.raises(ValueError, match="has only 2"):
        slot_resources([host[0]], host, {0: (0, 1)})
    with pytest.raises(ValueError, match="no NUMA node 1"):
        slot_resources([host[4]], host, {0: tuple(range(112))})
    with pytest.raises(ValueError, match="at least one slot"):
        slot_resources([], host, cpus)


def test_fit_to_host_drops_the_hardware_and_caps_the_size():
    big = spec(memory_mib=256 * 1024, vcpus=4, hugepages_1g=True, console_socket="/run/a.sock")
    small = fit_to_host(big, memory_mib=256, vcpus=1)
    assert (small.memory_mib, small.vcpus, small.passthrough, small.hugepages_1g) == (256, 1, False, False)
    assert small.cpuset == small.emulator_cpuset == () and small.numa_node is None
    kept = ("slots", "metadata", "nic", "console_socket")
    assert [getattr(small, f) for f in kept] == [getattr(big, f) for f in kept]
    root = parsed(small)
    for gone in ("cputune", "numatune", "memoryBacking", "devices/hostdev", "devices/interface[@type='hostdev']"):
        assert root.find(gone) is None, gone
    assert fit_to_host(spec(memory_mib=128, vcpus=1, cpuset=(4,)), memory_mib=512, vcpus=2).memory_mib == 128


# host facts, against a fake sysfs tree

def fake_sysfs(root, nodes: dict[int, str], pages: dict[int, int]):
    for n, cpulist in nodes.items():
        d = root / f"devices/system/node/node{n}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpulist + "\n")
    (root / "devices/system/node/online").write_text(",".join(map(str, nodes)) + "\n")
    for n, free in pages.items():
        pool = root / f"devices/system/node/node{n}/hugepages/hugepages-1048576kB"
        pool.mkdir(parents=True)
        (pool / "free_hugepages").write_text(f"{free}\n")
        (pool / "nr_hugepages").write_text(f"{free + 3}\n")
    return root


def test_numa_cpus_reads_each_nodes_cpulist(tmp_path):
    root = fake_sysfs(tmp_path, {0: "0-3,8-11", 1: "4-7,12-15", 10: "16"}, {})
    assert numa_cpus(root) == {0: (0, 1, 2, 3, 8, 9, 10, 11), 1: (4, 5, 6, 7, 12, 13, 14, 15), 10: (16,)}


def test_a_kernel_without_numa_has_every_online_cpu_on_node_0(tmp_path):
    (tmp_path / "devices/system/cpu").mkdir(parents=True)
    (tmp_path / "devices/system/cpu/online").write_text("0-1\n")
    assert numa_cpus(tmp_path) == {0: (0, 1)}


def test_free_1g_hugepages_per_node_and_none_without_a_pool(tmp_path):
    root = fake_sysfs(tmp_path, {0: "0-1", 1: "2-3"}, {1: 5})
    assert hugepages_1g(root, 1) == 5 and hugepages_1g(root, 0) == 0 and hugepages_1g(root, 7) == 0


@pytest.mark.parametrize("text, cpus", [("0-3,8-11\n", (0, 1, 2, 3, 8, 9, 10, 11)), ("5", (5,)), ("\n", ()), ("2,1,2", (1, 2))])
def test_parse_cpulist(text, cpus):
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize("text", ["3-1", "a", "1-", "0-3;5"])
def test_parse_cpulist_refuses_malformed_lists(text):
    with pytest.raises(ValueError, match="malformed cpulist"):
        parse_cpulist(text)


def test_sim_numa_nodes_get_consecutive_cpus():
    cpus = sim_numa_cpus(sim_topology("node-a", "hgx-h100-8").numa_nodes)
    assert cpus == {0: tuple(range(112)), 1: tuple(range(112, 224))}
