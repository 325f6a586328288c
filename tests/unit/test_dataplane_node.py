"""KernelDataplane's transitions over a fake kernel (no I/O), and the dataplane settings."""
from __future__ import annotations

import uuid

import pytest

from services.network.contracts import NetworkSnapshot, SecurityRule, SlotAttachment, TenantNetworks
from services.node_agent.adapters.dataplane import Kernel, KernelDataplane, KernelError, NullDataplane
from services.node_agent.bootstrap import build_dataplane
from services.node_agent.domain.dataplane.model import InvalidAttachment
from services.node_agent.domain.dataplane.names import bridge_name, leg_name, slot_port_name, vxlan_name
from services.node_agent.settings import NodeAgentSettings, load_settings
from shared.settings import SettingError


class FakeKernel(Kernel):
    """Records which owned objects exist; ``fail`` names a kind whose creation raises."""

    def __init__(self, fail: str | None = None):
        super().__init__("0a1b2c3d")
        self.there: dict[tuple[str, str], str] = {}
        self.fail = fail

    def _make(self, kind, name, fp=""):
        if kind == self.fail:
            raise KernelError(f"injected: {kind} {name}")
        self.there[(kind, name)] = fp

    def ensure_router(self, name): self._make("router", name)
    def remove_netns(self, name):   # as in the kernel: a namespace's tables go with it
        self.there.pop(("router", name), None)
        self.there.pop(("nft_router", name), None)
    def remove_link(self, name): [self.there.pop(k) for k in list(self.there) if k[1] == name]
    def ensure_bridge(self, seg): self._make("bridge", bridge_name(seg.vni))
    def ensure_vxlan(self, seg): self._make("vxlan", vxlan_name(seg.vni))
    def ensure_leg(self, seg): self._make("leg", leg_name(seg.vni))
    def ensure_slot(self, slot): self._make("slot", slot.netns)
    def remove_slot(self, ns, port): self.there.pop(("slot", ns), None)

    def apply_nft(self, ns, family, body, fp=""):
        key = ("nft_node", "node") if ns is None else ("nft_router", ns)
        if body is None:
            self.there.pop(key, None)
        else:
            self._make(key[0], key[1], fp)


def tenant(version=1, rules=()):
    a = NetworkSnapshot(network_id=uuid.UUID(int=1), name="a", vni=11, cidr="10.0.1.0/24", gateway_ip="10.0.1.1", vrf_table=1)
    b = NetworkSnapshot(network_id=uuid.UUID(int=2), name="b", vni=12, cidr="10.0.2.0/24", gateway_ip="10.0.2.1",
                        vrf_table=1, rules=list(rules))
    return TenantNetworks(tenant_id=uuid.UUID(int=99), version=version, networks=[a, b])


def slot(ip="10.0.1.10"):
    return SlotAttachment(attachment_id=uuid.uuid4(), allocation_id=uuid.uuid4(), network_id=uuid.UUID(int=1),
                          ip_address=ip, prefix_len=24, mac_address="02:00:00:00:00:10")


def test_attach_creates_the_desired_objects_and_detach_of_the_last_slot_removes_them_all():
    kernel = KernelDataplane(FakeKernel())
    first, second = slot(), slot("10.0.1.11")
    kernel.attach(tenant(), first)
    kernel.attach(tenant(), second)
    assert set(kernel.kernel.there) == set(kernel.desired().objects())
    assert kernel.detach(first.allocation_id)
    assert ("bridge", "tbr00000b") in kernel.kernel.there and len([k for k in kernel.kernel.there if k[0] == "slot"]) == 1
    assert kernel.detach(second.allocation_id) and kernel.kernel.there == {}
    assert not kernel.detach(second.allocation_id)


def test_attach_failing_midway_removes_what_it_made_and_forgets_the_attachment():
    dp = KernelDataplane(FakeKernel(fail="slot"))
    with pytest.raises(KernelError, match="injected"):
        dp.attach(tenant(), slot())
    assert dp.kernel.there == {} and dp.attachments == {}


def test_a_second_attach_failing_keeps_the_first_slot_intact():
    dp = KernelDataplane(FakeKernel())
    ok = slot()
    dp.attach(tenant(), ok)
    before = dict(dp.kernel.there)
    dp.kernel.fail = "slot"
    with pytest.raises(KernelError):
        dp.attach(tenant(), slot("10.0.1.12"))
    assert dp.kernel.there == before and list(dp.attachments) == [ok.allocation_id]


def test_an_invalid_attachment_touches_nothing():
    dp = KernelDataplane(FakeKernel())
    with pytest.raises(InvalidAttachment):
        dp.attach(tenant(), slot("192.168.0.5"))
    assert dp.kernel.there == {} and dp.attachments == {}


def test_update_tenant_keeps_the_highest_version_and_re_renders_only_the_router_rules():
    dp = KernelDataplane(FakeKernel())
    dp.attach(tenant(), slot())
    router_fp = next(fp for (k, _), fp in dp.kernel.there.items() if k == "nft_router")
    rule = SecurityRule(id=uuid.uuid4(), direction="ingress", protocol="tcp", port_from=22, remote_network_id=uuid.UUID(int=1))
    assert dp.update_tenant(tenant(version=3, rules=[rule]))
    assert not dp.update_tenant(tenant(version=2)) and dp.tenants[uuid.UUID(int=99)].version == 3
    assert next(fp for (k, _), fp in dp.kernel.there.items() if k == "nft_router") != router_fp
    assert set(dp.kernel.there) == set(dp.desired().objects())


def test_null_dataplane_plumbs_nothing():
    dp = NullDataplane()
    assert dp.attach(tenant(), slot()) is None and dp.detach(uuid.uuid4()) is False and dp.reconcile() == []


def test_dataplane_defaults_to_none_and_kernel_without_root_fails_with_one_clear_line():
    assert load_settings({}) == NodeAgentSettings()
    with pytest.raises(SettingError, match="TESSERA_NODE_DATAPLANE=kernel needs root"):
        load_settings({"TESSERA_NODE_DATAPLANE": "kernel"}, euid=1000)


@pytest.mark.parametrize("environ, message", [
    ({"TESSERA_NODE_DATAPLANE": "ovs"}, "expected 'none' or 'kernel'"),
    ({"TESSERA_NODE_RECONCILE_S": "soon"}, "not a number"),
    ({"TESSERA_NODE_RECONCILE_S": "0"}, "must be positive"),
    ({"TESSERA_NODE_DATAPLANE": "kernel", "TESSERA_NODE_NETNS": "no-such-ns-4f1c"}, "no such network namespace"),
])
def test_bad_dataplane_settings_are_refused_naming_the_variable(environ, message):
    with pytest.raises(SettingError, match=message):
        load_settings(environ, euid=0)


def test_kernel_config_builds_a_kernel_dataplane_for_the_nodes_tag_without_touching_the_kernel():
    node_id = uuid.uuid4()
    dp = build_dataplane(NodeAgentSettings(dataplane="kernel", netns="ns-x", underlay_dev="ul0", reconcile_s=5), node_id)
    assert isinstance(dp, KernelDataplane) and dp.kernel.tag == node_id.hex[:8] and dp.kernel._ipr is None
    assert slot_port_name(uuid.UUID(int=0)) == "tv00000000"
