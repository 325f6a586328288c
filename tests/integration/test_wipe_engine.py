"""The wipe engine against real loop devices (root): a 16 MiB file full of a known pattern, carrying an ext4
signature, behind a loop device that is always detached afterwards. NVMe commands fail on a loop device,
which is exactly the "not an NVMe controller" case."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid

import pytest

from services.node_agent.adapters.wipe import ENV_DEVICES, Wiper

MIB = 1 << 20
SIZE = 16 * MIB
PATTERN = b"TESSERA-TENANT-DATA-" + uuid.uuid4().hex.encode()
TOOLS = ("losetup", "blkdiscard", "wipefs", "blockdev", "mkfs.ext4", "nvme")

pytestmark = pytest.mark.root


@pytest.fixture(scope="module", autouse=True)
def clean_streams():
    """This module needs no message bus: it replaces the integration conftest's stream purge, so its tests
    start neither NATS nor PostgreSQL."""
    yield


def _need_block_tools():
    if os.geteuid() != 0:
        pytest.skip("loop devices need root")
    missing = [t for t in TOOLS if shutil.which(t) is None]
    assert not missing, f"not installed: {', '.join(missing)} (./taskw installs system-packages.txt)"


def _sh(*argv: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}"
    return done.stdout


@pytest.fixture
def disk(tmp_path):
    """(loop device, backing file): ext4 on top of the pattern, and the pattern written into the data area."""
    _need_block_tools()
    backing = tmp_path / "slot.img"
    with open(backing, "wb") as f:
        f.write((PATTERN * (SIZE // len(PATTERN) + 1))[:SIZE])
    dev = _sh("losetup", "--find", "--show", str(backing)).strip()
    try:
        _sh("blockdev", "--setrw", dev)     # a read-only flag outlives a detach: another user may have left one
        _sh("mkfs.ext4", "-q", "-F", "-E", "nodiscard", dev)
        fd = os.open(dev, os.O_WRONLY)
        try:
            os.pwrite(fd, PATTERN * 1000, 12 * MIB)          # file data, well past the ext4 metadata
            os.fsync(fd)
        finally:
            os.close(fd)
        assert "ext4" in _sh("wipefs", "--no-act", "--noheadings", dev)
        assert backing.read_bytes().count(PATTERN) > 1000
        yield dev, backing
    finally:
        subprocess.run(["blockdev", "--setrw", dev], capture_output=True)
        _sh("losetup", "-d", dev)


def _no_gpu_driver(monkeypatch):
    monkeypatch.setenv("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")      # whatever this host has, no nvidia-smi


async def test_nvme_erase_with_discard_fallback_erases_a_non_nvme_device(disk, monkeypatch):
    dev, backing = disk
    _no_gpu_driver(monkeypatch)
    ev = await Wiper(device_map={0: [dev]}).wipe_slot(0, nvme_pci=None, gpu_pci=None, policy="nvme-secure-erase+discard")
    assert ev.ok, ev.reason
    assert ev.reason is None and ev.gpu_reset == "no-driver" and ev.policy == "nvme-secure-erase+discard"
    [d] = ev.devices
    assert (d.device, d.method, d.bytes, d.verified, d.ok) == (dev, "blkdiscard+wipefs", SIZE, True, True)
    assert f"nvme id-ctrl {dev} -o json" in d.commands
    assert f"blkdiscard {dev}" in d.commands and f"wipefs --all --force {dev}" in d.commands
    assert "no signature" in d.verification
    data = backing.read_bytes()
    assert PATTERN not in data and not data.strip(b"\0"), "tenant data left on the backing file"
    assert _sh("wipefs", "--no-act", "--noheadings", dev).strip() == ""
    assert json.loads(json.dumps(ev.to_dict()))["devices"][0]["commands"] == list(d.commands)


async def test_nvme_only_policy_destroys_nothing_on_a_non_nvme_device(disk, monkeypatch):
    dev, backing = disk
    _no_gpu_driver(monkeypatch)
    ev = await Wiper(device_map={0: [dev]}).wipe_slot(0, nvme_pci=None, gpu_pci=None, policy="nvme-secure-erase")
    assert not ev.ok
    assert "nvme id-ctrl" in ev.reason and "no fallback" in ev.reason and "Invalid argument" in ev.reason
    [d] = ev.devices
    assert not d.ok and not d.verified and d.method == "none"
    assert not any(c.startswith(("blkdiscard", "wipefs --all", "nvme format")) for c in d.commands)
    assert backing.read_bytes().count(PATTERN) > 1000
    assert "ext4" in _sh("wipefs", "--no-act", "--noheadings", dev)


async def test_a_read_only_device_fails_the_wipe_naming_the_command(disk, monkeypatch):
    dev, _ = disk
    _no_gpu_driver(monkeypatch)
    _sh("blockdev", "--setro", dev)
    ev = await Wiper(device_map={0: [dev]}).wipe_slot(0, nvme_pci=None, gpu_pci=None, policy="discard")
    assert not ev.ok
    assert f"`blkdiscard {dev}` failed" in ev.reason and "Operation not permitted" in ev.reason
    assert ev.devices[0].commands[-1] == f"blkdiscard {dev}"


@pytest.mark.parametrize("exit_code, expected", [(0, "reset"), (3, "failed: ")])
async def test_the_gpu_is_reset_when_a_driver_is_present(disk, tmp_path, monkeypatch, exit_code, expected):
    dev, _ = disk
    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "calls"
    fake = bindir / "nvidia-smi"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {calls}\necho "GPU busy" >&2\nexit {exit_code}\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/sbin:/usr/bin:/sbin:/bin")
    ev = await Wiper(device_map={1: [dev]}).wipe_slot(1, nvme_pci=None, gpu_pci="0000:1b:00.0", policy="discard")
    assert calls.read_text().split() == ["--gpu-reset", "-i", "0000:1b:00.0"]
    assert ev.gpu_reset.startswith(expected) and ev.devices[0].ok
    assert ev.ok is (exit_code == 0)
    if exit_code:
        assert "GPU reset failed" in ev.reason and "GPU busy" in ev.reason


async def test_a_slot_without_a_device_fails_unless_simulated(tmp_path):
    ev = await Wiper(sysfs=str(tmp_path)).wipe_slot(5, nvme_pci="0000:99:00.0", gpu_pci=None, policy="discard")
    assert (ev.ok, ev.reason, ev.devices) == (False, "no block device for slot 5 (nvme 0000:99:00.0)", ())
    sim = await Wiper(simulate=True, agent_version="9.9").wipe_slot(5, nvme_pci=None, gpu_pci=None, policy="discard")
    assert sim.ok and sim.gpu_reset == "simulated" and sim.agent_version == "9.9"
    assert [(d.device, d.method, d.bytes, d.ok) for d in sim.devices] == [("simulated", "simulated", 0, True)]
    assert sim.finished_at >= sim.started_at and json.dumps(sim.to_dict())


async def test_an_unknown_policy_is_an_outcome_not_an_exception():
    ev = await Wiper(simulate=True).wipe_slot(0, nvme_pci=None, gpu_pci=None, policy="shred")
    assert not ev.ok and "unknown wipe policy 'shred'" in ev.reason and "nvme-secure-erase" in ev.reason


def test_devices_are_found_from_the_nvme_controller_in_sysfs(tmp_path):
    ctrl = tmp_path / "bus/pci/devices/0000:5e:00.0/nvme/nvme2"
    for ns in ("nvme2n2", "nvme2n1", "nvme2c2n3", "ng2n1"):
        (ctrl / ns).mkdir(parents=True)
    wiper = Wiper(sysfs=str(tmp_path), device_map={7: ["/dev/loop9"]})
    assert wiper.devices_for(0, "0000:5e:00.0") == ["/dev/nvme2n1", "/dev/nvme2n2", "/dev/nvme2n3"]
    assert wiper.devices_for(7, "0000:5e:00.0") == ["/dev/loop9"]                 # the override wins
    assert wiper.devices_for(0, "0000:00:00.0") == [] and wiper.devices_for(0, None) == []


def test_wipe_devices_come_from_the_environment():
    wiper = Wiper.from_env({ENV_DEVICES: '{"0": ["/dev/loop3"], "2": ["/dev/loop4", "/dev/loop5"]}'}, simulate=False)
    assert wiper.devices_for(0, None) == ["/dev/loop3"] and wiper.devices_for(2, None) == ["/dev/loop4", "/dev/loop5"]
    assert not wiper.simulate
    assert Wiper.from_env({}, simulate=True).device_map == {} and Wiper.from_env({ENV_DEVICES: " "}, simulate=True).simulate


@pytest.mark.parametrize("raw", ['{"0": "/dev/loop3"}', "not json", '["/dev/loop3"]', '{"a": ["/dev/loop3"]}',
                                 '{"-1": ["/dev/loop3"]}', '{"0": ["loop3"]}', '{"0": [3]}'])
def test_a_malformed_wipe_devices_variable_is_refused_by_name(raw):
    with pytest.raises(ValueError, match=ENV_DEVICES):
        Wiper.from_env({ENV_DEVICES: raw}, simulate=False)


async def test_a_mounted_device_is_refused_before_anything_runs(disk, tmp_path, monkeypatch):
    dev, backing = disk
    _no_gpu_driver(monkeypatch)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    _sh("mount", dev, str(mnt))
    try:
        ev = await Wiper(device_map={0: [dev]}).wipe_slot(0, nvme_pci=None, gpu_pci=None, policy="discard")
    finally:
        _sh("umount", str(mnt))
    assert not ev.ok and "in use" in ev.reason and ev.devices[0].commands == ()
    assert backing.read_bytes().count(PATTERN) > 1000
