"""The recording NVCF driver: what it would run, in order, and what it reports."""
from __future__ import annotations

import inspect
import json

import pytest

from services.paas.adapters.spot.nvcf import RecordingNvcfProvider
from services.paas.domain.spot import SpotCapacityProvider


def test_the_driver_keeps_the_provider_signatures():
    methods = [n for n, f in vars(SpotCapacityProvider).items() if inspect.iscoroutinefunction(f)]
    assert len(methods) == 6
    for name in methods:
        assert inspect.signature(getattr(RecordingNvcfProvider, name)) == inspect.signature(
            getattr(SpotCapacityProvider, name))


def calls(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
async def provider(tmp_path):
    p = RecordingNvcfProvider(tmp_path / "spot" / "calls.jsonl", clock=lambda: 1000.0)
    await p.register_cluster("tessera-east", "tessera-spot", "eu-west", "TESSERA", ("nca-1",), ("CacheOptimized",))
    return p


async def test_registration_records_the_operator_install_and_the_expected_cluster_group(provider):
    [call] = calls(provider.record)
    helm = call["commands"][0]
    assert helm[:3] == ["helm", "upgrade", "nvca-operator"] and "--wait" in helm
    sets = dict(helm[i + 1].split("=", 1) for i, a in enumerate(helm) if a == "--set")
    assert sets["ngcConfig.serviceKey"] == "$NVCF_CLUSTER_KEY"       # the key itself is never written
    assert sets["helmManaged.clusterGroupName"] == "tessera-spot" and sets["helmManaged.clusterRegion"] == "eu-west"
    group = call["expect"]["clusterGroups"][0]
    assert group["name"] == "tessera-spot" and group["authorizedNcaIds"] == ["nca-1"] and group["gpus"] == []
    assert group["clusters"][0]["id"] == sets["clusterID"]
    with pytest.raises(ValueError, match="immutable"):
        await provider.register_cluster("renamed", "g", "r", "P", (), ())


async def test_offer_then_reclaim_labels_cordons_and_drains_each_node(provider):
    provider.in_use = lambda node, gpus: gpus if node == "n1" else 1
    await provider.offer_nodes(("n1", "n2"), "H100", 8, until=4600.0)
    assert await provider.report_usage() == {"H100": {"offered": 16, "in_use": 9}}
    offer = calls(provider.record)[-1]
    assert ["kubectl", "uncordon", "n2"] in offer["commands"]
    assert ["kubectl", "label", "node", "n1", "--overwrite", "nvca.nvcf.nvidia.io/schedule=true",
            "tessera.io/spot-gpus=8", "tessera.io/spot-until=4600"] in offer["commands"]
    assert offer["expect"]["clusterGroups"][0]["gpus"][0]["name"] == "H100"

    await provider.reclaim_nodes(("n1",), grace_s=30, mode="cordon_and_drain")
    await provider.reclaim_nodes(("n2",), grace_s=120, mode="cordon")
    drain, cordon = calls(provider.record)[-2:]
    assert [c[1] for c in drain["commands"]] == ["label", "cordon", "drain"]
    assert "--grace-period=30" in drain["commands"][2] and "--timeout=60s" in drain["commands"][2]
    assert [c[1] for c in cordon["commands"]] == ["label", "cordon"]
    # while the notice runs, the spot work still uses the GPUs; nothing is offered any more
    assert await provider.report_usage() == {"H100": {"offered": 0, "in_use": 9}}
    provider.released(("n1", "n2"))
    assert await provider.report_usage() == {}


async def test_maintenance_patches_the_agent_and_deregister_uninstalls_once(provider):
    await provider.set_maintenance(True)
    patch = calls(provider.record)[-1]["commands"][0]
    assert patch[:3] == ["kubectl", "patch", "nvcfbackends.nvcf.nvidia.io"]
    assert json.loads(patch[-1]) == {"spec": {"overrides": {"featureGate": {"values": ["CordonMaintenance"]}}}}
    await provider.deregister()
    await provider.deregister()                     # an unregistered cluster is fine
    assert [c["call"] for c in calls(provider.record)] == ["register_cluster", "set_maintenance", "deregister"]
    with pytest.raises(RuntimeError):
        await provider.offer_nodes(("n1",), "H100", 8, until=0)
