"""The wipe engine's pure decisions: policies, NVMe format level, what is read back, evidence."""
from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from services.node_agent.domain import wipe
from services.node_agent.domain.wipe import (
    DeviceEvidence,
    SlotEvidence,
    WipePolicy,
    WipePolicyError,
    nvme_format_level,
    parse_policy,
)


@pytest.mark.parametrize("name, nvme, fallback", [
    ("nvme-secure-erase", True, False),
    ("nvme-secure-erase+discard", True, True),
    ("discard", False, True),
])
def test_known_policies_parse_to_their_steps(name, nvme, fallback):
    assert parse_policy(name) == WipePolicy(name, nvme=nvme, fallback=fallback)


def test_default_policy_is_nvme_secure_erase_without_fallback():
    assert wipe.DEFAULT_POLICY == "nvme-secure-erase"
    assert parse_policy(wipe.DEFAULT_POLICY).fallback is False


@pytest.mark.parametrize("name", ["", None, "shred", "NVME-SECURE-ERASE", "discard+nvme"])
def test_unknown_or_empty_policy_is_refused_naming_the_known_ones(name):
    with pytest.raises(WipePolicyError) as e:
        parse_policy(name)
    assert isinstance(e.value, ValueError)
    for known in ("nvme-secure-erase", "nvme-secure-erase+discard", "discard"):
        assert known in str(e.value)


def test_policies_are_frozen():
    with pytest.raises(AttributeError):
        parse_policy("discard").fallback = False


@pytest.mark.parametrize("id_ctrl, level", [
    ({"oacs": 0x17, "fna": 0x4}, 2),        # crypto erase supported wins
    ({"oacs": 0x17, "fna": 0x0}, 1),        # format supported, no crypto erase
    ({"oacs": 0x2, "fna": 0x3}, 1),         # fna bits 0-1 are not crypto erase
    ({"oacs": 0x5, "fna": 0x0}, None),      # no Format NVM
    ({"oacs": 0x0, "fna": 0x4}, 2),         # Ironic checks fna first
    ({}, None),
    ({"oacs": "0x17", "fna": "0x4"}, 2),    # hex strings, as some nvme-cli versions print
    ({"oacs": "junk", "fna": None}, None),
])
def test_nvme_format_level_follows_ironic(id_ctrl, level):
    assert nvme_format_level(id_ctrl) == level


def test_format_commands_are_ironics():
    assert wipe.nvme_format_argv("/dev/nvme0n1", 2) == ("nvme", "format", "/dev/nvme0n1", "-s", "2", "-f")
    assert wipe.format_method(2) == "nvme-format-crypto"
    assert wipe.format_method(1) == "nvme-format-user-data"
    assert wipe.wipefs_argv("/dev/x") == ("wipefs", "--all", "--force", "/dev/x")


def test_a_failure_reason_names_the_command_and_its_stderr():
    reason = wipe.command_failure(("blkdiscard", "/dev/loop3"), 1, "blkdiscard: /dev/loop3: BLKDISCARD ioctl failed: "
                                  "Operation not permitted\n")
    assert "`blkdiscard /dev/loop3`" in reason and "exit 1" in reason and "Operation not permitted" in reason
    assert "timed out" in wipe.command_failure(("nvme", "format"), None, "")


def test_verification_reads_the_ends_and_spread_samples_only():
    size = 1 << 30
    ranges = wipe.verification_ranges(size, 16)
    assert ranges[0] == (0, wipe.MIB) and ranges[-1] == (size - wipe.MIB, wipe.MIB)
    middle = ranges[1:-1]
    assert len(middle) == 16 and all(n == 4096 and o % 4096 == 0 for o, n in middle)
    assert all(wipe.MIB <= o and o + n <= size - wipe.MIB for o, n in middle)
    assert [o for o, _ in middle] == sorted({o for o, _ in middle})          # distinct, sorted
    assert middle[0][0] < size // 8 and middle[-1][0] > size * 7 // 8        # spread over the device
    assert wipe.verification_ranges(size, 16) == ranges                      # deterministic
    assert sum(n for _, n in ranges) == sum(n for _, n in wipe.verification_ranges(1 << 40, 16))   # O(1) in size


def test_verification_of_a_small_device_reads_it_all_once():
    assert wipe.verification_ranges(wipe.MIB + 4096, 16) == ((0, wipe.MIB + 4096),)
    assert wipe.verification_ranges(0, 16) == ()
    assert wipe.verification_ranges(16 * wipe.MIB, 0) == ((0, wipe.MIB), (15 * wipe.MIB, wipe.MIB))
    assert wipe.end_ranges(16 * wipe.MIB) == ((0, wipe.MIB), (15 * wipe.MIB, wipe.MIB))


def test_first_nonzero_and_signatures():
    assert wipe.first_nonzero(bytes(4096)) is None
    assert wipe.first_nonzero(bytes(100) + b"\x01" + bytes(10)) == 100
    assert wipe.first_nonzero(b"") is None
    assert wipe.signatures("") == [] and wipe.signatures("\n  \n") == []
    assert wipe.signatures("loop0 0x438 ext4 57eb \n") == ["loop0 0x438 ext4 57eb"]


def _device(ok=True, reason=None, device="/dev/nvme0n1"):
    return DeviceEvidence(device=device, method="nvme-format-crypto", bytes=1 << 30, duration_s=0.5, verified=ok,
                          verification="ok" if ok else "non-zero data at byte 7", ok=ok, reason=reason,
                          commands=("nvme id-ctrl /dev/nvme0n1 -o json", "nvme format /dev/nvme0n1 -s 2 -f"))


def test_slot_outcome_needs_every_device_and_the_gpu_reset():
    assert wipe.slot_outcome([_device(), _device(device="/dev/nvme0n2")], "reset") == (True, None)
    assert wipe.slot_outcome([_device()], "no-driver") == (True, None)
    assert wipe.slot_outcome([_device(), _device(False, "/dev/nvme0n2: boom")], "reset") == (False, "/dev/nvme0n2: boom")
    ok, reason = wipe.slot_outcome([_device()], "failed: `nvidia-smi --gpu-reset -i 0000:1b:00.0` failed (exit 3): busy")
    assert not ok and "GPU reset failed" in reason and "busy" in reason
    assert wipe.slot_outcome([], "reset")[0] is False


def test_slot_evidence_to_dict_is_json_ready():
    start = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
    ev = SlotEvidence(slot=3, devices=(_device(),), gpu_reset="reset", ok=True, reason=None, policy="nvme-secure-erase",
                      started_at=start, finished_at=start + timedelta(seconds=2), duration_s=2.0, agent_version="0.1.0")
    d = ev.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["started_at"] == "2025-03-01T12:00:00+00:00" and d["finished_at"] == "2025-03-01T12:00:02+00:00"
    assert d["devices"][0]["commands"] == ["nvme id-ctrl /dev/nvme0n1 -o json", "nvme format /dev/nvme0n1 -s 2 -f"]
    assert d["devices"][0]["method"] == "nvme-format-crypto" and d["devices"][0]["bytes"] == 1 << 30
    assert {k: d[k] for k in ("slot", "gpu_reset", "ok", "reason", "policy", "agent_version")} == {
        "slot": 3, "gpu_reset": "reset", "ok": True, "reason": None, "policy": "nvme-secure-erase", "agent_version": "0.1.0"}


def test_reasons_stay_within_the_wire_bounds():
    reason = wipe.command_failure(("nvidia-smi", "--gpu-reset", "-i", "x" * 500), 1, "y" * 5000 + "\n" + "z" * 5000)
    assert len("failed: " + reason) <= 500 and "exit 1" in reason
    with pytest.raises(WipePolicyError) as e:
        parse_policy("p" * 10_000)
    assert len(str(e.value)) < 300
