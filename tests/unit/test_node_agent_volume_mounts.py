"""The pure side of mounting tenant volumes: the volume checks and virtiofs tags, the rendered client
mount commands of appliance volumes, the path check of volume roots, the virtiofs devices and shared memory of a
VM slice's domain XML, and cloud-init's ``mounts`` in the NoCloud user-data."""
from __future__ import annotations

import dataclasses
import uuid
import xml.etree.ElementTree as ET

import pytest
import yaml

from services.node_agent.domain.vm.cloudinit import GuestMount, Seed, user_data
from services.node_agent.domain.vm.domain_xml import DomainSpec, Nic, domain_name, domain_xml
from services.node_agent.domain.vm.filesystems import Filesystem, filesystem_xml
from services.node_agent.domain.volumes import (
    InvalidVolume,
    MountedVolume,
    Volume,
    check_distinct,
    client_mount_argv,
    simulated_mount,
    virtiofs_tag,
    within,
)
from services.node_agent.handlers.spec import volumes as volumes_of
from services.storage.contracts import VolumeExport

VID = uuid.UUID("0123abcd-4567-89ef-0123-456789abcdef")


def volume(**over) -> Volume:
    base = dict(volume_id=VID, name="data", mode="rw", backend="btrfs", source="/srv/volumes/tenants/t/v")
    return Volume(**{**base, **over})


def vm_spec(**over) -> DomainSpec:
    base = dict(name=domain_name(uuid.uuid4()), uuid=str(uuid.uuid4()), domain_type="qemu", memory_mib=256, vcpus=1,
                cpuset=(), emulator_cpuset=(), numa_node=None, hugepages_1g=False, slots=(), passthrough=False,
                nic=Nic("52:54:00:12:34:56", "tap-a1"), disk="/var/lib/tessera/a.qcow2", seed_iso=None, boot=None,
                console_log="/var/log/tessera/a.log", console_socket=None, metadata={"allocation_id": "a1"})
    return DomainSpec(**{**base, **over})


# -- volumes ------------------------------------------------------------------------------------------------
def test_a_volume_appears_at_mnt_name_and_its_tag_is_short_and_its_own():
    v = volume()
    assert v.mount_point == "/mnt/data" and not v.read_only and not v.simulated
    assert v.tag == virtiofs_tag(VID) == "tv-0123abcd4567" and len(v.tag.encode()) <= 36
    assert virtiofs_tag(uuid.uuid4()) != v.tag


@pytest.mark.parametrize("over, what", [
    ({"name": "../etc"}, "name"), ({"name": "a/b"}, "name"), ({"name": "Data"}, "name"), ({"name": ""}, "name"),
    ({"mode": "rwx"}, "mode"), ({"backend": "ceph"}, "backend"), ({"source": "relative/dir"}, "absolute path"),
    ({"source": "/a b"}, "printable word"), ({"source": "/a\nb"}, "printable word"),
    ({"options": (("vers", "3,rw"),)}, "mount option"), ({"options": (("a b", ""),)}, "mount option"),
])
def test_a_volume_no_node_can_mount_safely_is_refused_naming_why(over, what):
    with pytest.raises(InvalidVolume, match=what):
        volume(**over)


def test_two_volumes_of_one_allocation_may_share_neither_id_nor_mount_point():
    other = volume(volume_id=uuid.uuid4(), name="other")
    assert check_distinct([volume(), other]) == (volume(), other)
    with pytest.raises(InvalidVolume, match="one name: data"):
        check_distinct([volume(), volume(volume_id=uuid.uuid4())])
    with pytest.raises(InvalidVolume, match="one id"):
        check_distinct([volume(), volume(name="again")])


def test_the_exports_of_a_provision_command_become_checked_volumes():
    export = VolumeExport(volume_id=VID, name="data", mode="ro", backend="vast", source="vip:/t/v",
                          options={"fstype": "nfs", "vers": "3", "hard": ""})
    [v] = volumes_of([export])
    assert v == Volume(VID, "data", "ro", "vast", "vip:/t/v", (("fstype", "nfs"), ("vers", "3"), ("hard", "")))


# -- appliance volumes: rendered, not run --------------------------------------------------------------------
def test_a_lustre_volume_renders_its_client_mount_and_is_reported_simulated():
    v = volume(backend="lustre", source="10.0.0.2@o2ib:/fs0", options=(("fstype", "lustre"), ("flock", "")))
    assert client_mount_argv(v) == ["mount", "-t", "lustre", "-o", "flock", "10.0.0.2@o2ib:/fs0", "/mnt/data"]
    mounted = simulated_mount(v)
    assert mounted.simulated and mounted.via == "lustre" and mounted.tag is None
    assert mounted.command == "mount -t lustre -o flock 10.0.0.2@o2ib:/fs0 /mnt/data"
    assert "command" not in mounted.info() and mounted.info()["simulated"] is True


def test_nfs_appliances_render_an_nfs_v3_mount_read_only_when_the_volume_is():
    vast = volume(backend="vast", mode="ro", source="vip.vast.example:/tessera/t/v",
                  options=(("fstype", "nfs"), ("vers", "3"), ("proto", "tcp"), ("hard", "")))
    assert client_mount_argv(vast) == ["mount", "-t", "nfs", "-o", "vers=3,proto=tcp,hard,ro",
                                       "vip.vast.example:/tessera/t/v", "/mnt/data"]
    weka = volume(backend="weka", source="nfs.weka.example:/fs-1")   # no options given: NFS v3
    assert client_mount_argv(weka) == ["mount", "-t", "nfs", "-o", "vers=3", "nfs.weka.example:/fs-1", "/mnt/data"]
    assert simulated_mount(weka).via == "nfs"
    with pytest.raises(InvalidVolume, match="mounted by the node"):
        client_mount_argv(volume())


def test_a_mount_survives_its_record_unchanged():
    m = MountedVolume(VID, "data", "/mnt/data", "ro", "virtiofs", tag="tv-0123abcd4567", source="/srv/v")
    assert MountedVolume.from_record(m.record()) == m
    assert m.info() == {"volume_id": str(VID), "name": "data", "mount_point": "/mnt/data", "mode": "ro",
                        "via": "virtiofs", "tag": "tv-0123abcd4567", "simulated": False}


# -- volume roots --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path, inside", [
    ("/srv/volumes/tenants/t/v", True), ("/srv/volumes/x", True), ("/srv/volumes", False),
    ("/srv/volumes-evil/x", False), ("/srv", False), ("/etc/shadow", False), ("/other/v", True),
])
def test_a_source_must_lie_strictly_below_a_volume_root(path, inside):
    assert within(path, ["/srv/volumes", "/other"]) is inside


# -- the domain XML ------------------------------------------------------------------------------------------
def test_each_btrfs_volume_is_a_virtiofs_device_and_the_memory_is_shared():
    fs = (Filesystem("/srv/volumes/tenants/t/v", "tv-0123abcd4567"), Filesystem("/run/tessera/views/a/b", "tv-b"))
    root = ET.fromstring(domain_xml(vm_spec(filesystems=fs)))
    devices = root.findall("devices/filesystem")
    assert [(d.get("type"), d.get("accessmode"), d.find("driver").get("type"), d.find("source").get("dir"),
             d.find("target").get("dir")) for d in devices] == [
        ("mount", "passthrough", "virtiofs", "/srv/volumes/tenants/t/v", "tv-0123abcd4567"),
        ("mount", "passthrough", "virtiofs", "/run/tessera/views/a/b", "tv-b")]
    backing = root.find("memoryBacking")
    assert backing.find("source").get("type") == "memfd" and backing.find("access").get("mode") == "shared"
    assert devices[0].find("readonly") is None   # libvirt 9.0 refuses it on virtiofs: the host shares a ro view


def test_without_volumes_the_memory_is_shared_only_when_volumes_may_be_attached_live():
    assert ET.fromstring(domain_xml(vm_spec())).find("memoryBacking") is None
    root = ET.fromstring(domain_xml(vm_spec(shared_memory=True)))
    assert root.find("memoryBacking/access").get("mode") == "shared" and root.find("devices/filesystem") is None


def test_huge_pages_stay_and_are_shared_instead_of_a_memfd():
    root = ET.fromstring(domain_xml(vm_spec(memory_mib=2048, hugepages_1g=True,
                                            filesystems=(Filesystem("/srv/v", "tv-a"),))))
    [backing] = root.findall("memoryBacking")
    assert backing.find("hugepages/page").get("size") == "1" and backing.find("source") is None
    assert backing.find("access").get("mode") == "shared"


def test_a_device_for_a_live_attach_is_the_same_filesystem_element():
    el = ET.fromstring(filesystem_xml(Filesystem("/srv/v", "tv-a")))
    assert el.tag == "filesystem" and el.find("target").get("dir") == "tv-a"
    assert el.find("source").get("dir") == "/srv/v"


@pytest.mark.parametrize("source, tag", [("relative", "tv-a"), ("/a b", "tv-a"), ("/srv/v", "t" * 37),
                                         ("/srv/v", "-x"), ("/srv/v", "a'b")])
def test_a_device_that_libvirt_or_virtiofs_would_refuse_is_refused_here(source, tag):
    with pytest.raises(ValueError):
        Filesystem(source, tag)


def test_two_devices_with_one_tag_are_refused():
    with pytest.raises(ValueError, match="tags repeat"):
        domain_xml(vm_spec(filesystems=(Filesystem("/srv/a", "tv-a"), Filesystem("/srv/b", "tv-a"))))


# -- cloud-init ----------------------------------------------------------------------------------------------
def seed(**over) -> Seed:
    base = dict(instance_id="i-0a1b2c", hostname="gpu-node-1", ssh_keys=(), mac="52:54:00:12:34:56",
                ip_address="10.254.3.10", prefix_len=24, gateway="10.254.3.1")
    return Seed(**{**base, **over})


def test_the_guest_is_told_to_mount_each_volume_as_cloud_init_mounts_reads_them():
    mounts = (GuestMount("tv-0123abcd4567", "/mnt/data"), GuestMount("tv-b", "/mnt/ref", read_only=True))
    text = user_data(seed(mounts=mounts))
    assert yaml.safe_load(text)["mounts"] == [["tv-0123abcd4567", "/mnt/data", "virtiofs", "defaults", "0", "0"],
                                              ["tv-b", "/mnt/ref", "virtiofs", "ro", "0", "0"]]
    # one flow list per line: the busybox guest's init reads them with awk
    assert '  - ["tv-b", "/mnt/ref", "virtiofs", "ro", "0", "0"]' in text.splitlines()
    assert "mounts" not in yaml.safe_load(user_data(seed()))


@pytest.mark.parametrize("tag, point", [("tv a", "/mnt/x"), ("tv-a", "/etc"), ("tv-a", "/mnt/../etc"),
                                        ("tv-a", "/mnt/x y"), ('tv"a', "/mnt/x")])
def test_a_mount_entry_that_could_escape_its_line_or_mnt_is_refused(tag, point):
    with pytest.raises(ValueError):
        GuestMount(tag, point)


def test_seed_mounts_are_guest_mounts_only():
    with pytest.raises(ValueError, match="GuestMount"):
        dataclasses.replace(seed(), mounts=(("tv-a", "/mnt/x"),))
