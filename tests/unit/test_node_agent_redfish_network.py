"""A bare-metal server's tenant-side interface: the redfish driver's network settings, the seed that gives the
server its tenant address beside its provisioning one, and what its instance reports of its network (the switch
port and HCA GUIDs the network service moves at hand-off). No BMC: sushy's client is stood in for."""
from __future__ import annotations

import uuid

import pytest
import yaml

from services.network.contracts import NetworkSnapshot, SlotAttachment, TenantNetworks
from services.node_agent import contracts as c
from services.node_agent import handlers
from services.node_agent.adapters.drivers import DriverConfigError
from services.node_agent.adapters.drivers.redfish import driver as redfish
from services.node_agent.adapters.drivers.redfish.bmc import BmcConfig
from services.node_agent.adapters.drivers.redfish.config import RedfishConfig
from services.node_agent.adapters.drivers.redfish.network import network_info, server_seed, tenant_addresses
from services.node_agent.adapters.drivers.redfish.records import instance_id
from services.node_agent.domain.model import BootImage, GuestConfig, InstanceSpec, NicConfig
from services.node_agent.domain.vm.cloudinit import network_config
from services.node_agent.handlers.spec import instance_spec
from shared.wire import step_key
from tests.support.node_agent import FakeNodeRecords, sim_node

BASE = {"TESSERA_REDFISH_SERVER_ADDRESS": "172.30.9.10/24"}
GUID = "0x0002c903000e0b72"
MAC = "52:54:00:aa:bb:cc"
PHONE_HOME = "http://172.30.9.1:8080/phone-home/t0k3n"


def config(**env) -> RedfishConfig:
    return RedfishConfig.from_env({**BASE, **env})


# --- settings ----------------------------------------------------------------------------------------------------
def test_the_switch_port_hca_guids_and_tenant_mtu_default_to_none_none_and_1450():
    found = config()
    assert (found.switch_port, found.hca_guids, found.tenant_mtu) == (None, (), 1450)


def test_the_switch_port_and_hca_guids_are_read_and_the_guids_normalised():
    found = config(TESSERA_REDFISH_SWITCH_PORT="leaf-07/swp12", TESSERA_REDFISH_TENANT_MTU="9000",
                   TESSERA_REDFISH_HCA_GUIDS="0x0002C903000E0B72, 0002:c903:000e:0b73")
    assert found.switch_port == ("leaf-07", "swp12") and found.tenant_mtu == 9000
    assert found.hca_guids == (GUID, "0x0002c903000e0b73")


@pytest.mark.parametrize(("var", "value"), [
    ("TESSERA_REDFISH_SWITCH_PORT", "leaf-07"), ("TESSERA_REDFISH_SWITCH_PORT", "/swp12"),
    ("TESSERA_REDFISH_SWITCH_PORT", "leaf-07/"), ("TESSERA_REDFISH_SWITCH_PORT", "leaf-07/swp12345678901234"),
    ("TESSERA_REDFISH_SWITCH_PORT", "-leaf/swp1"), ("TESSERA_REDFISH_SWITCH_PORT", "leaf 7/swp1"),
    ("TESSERA_REDFISH_HCA_GUIDS", "0x12"), ("TESSERA_REDFISH_HCA_GUIDS", "0002c903000e0b72"),
    ("TESSERA_REDFISH_HCA_GUIDS", f"{GUID},{GUID}"), ("TESSERA_REDFISH_HCA_GUIDS", "0xg002c903000e0b72"),
    ("TESSERA_REDFISH_HCA_GUIDS", ",".join(f"0x{i:016x}" for i in range(17))),
    ("TESSERA_REDFISH_TENANT_MTU", "100"), ("TESSERA_REDFISH_TENANT_MTU", "9217"),
    ("TESSERA_REDFISH_TENANT_MTU", "jumbo"),
])
def test_a_bad_network_setting_is_refused_naming_the_variable(var, value):
    with pytest.raises(DriverConfigError, match=var):
        config(**{var: value})


# --- the seed ----------------------------------------------------------------------------------------------------
def spec(nic: NicConfig | None = None) -> InstanceSpec:
    image = BootImage("tessera-guest", "raw", "/images/guest.img", "0" * 64, kernel="/k", initrd="/i")
    return InstanceSpec(uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), (0,), nic=nic,
                        guest=GuestConfig(image, "bm-1", ("ssh-ed25519 AAAAkey",), ("10.8.0.1",)))


def tenant_nic(mtu: int | None = None, ip: str = "10.8.0.5") -> NicConfig:
    return NicConfig("ts-port", "02:00:00:00:00:10", ip, 24, "10.8.0.1", mtu)


def seed_of(found: InstanceSpec, cfg: RedfishConfig | None = None):
    return server_seed(found, cfg or config(), instance_id="bm-1", mac=MAC, phone_home=PHONE_HOME)


def test_without_a_tenant_nic_the_seed_is_the_provisioning_networks_alone():
    seed = seed_of(spec(), config(TESSERA_REDFISH_SERVER_GATEWAY="172.30.9.1"))
    assert (seed.ip_address, seed.prefix_len, seed.gateway, seed.extra_addresses, seed.mtu) == (
        "172.30.9.10", 24, "172.30.9.1", (), None)
    assert seed.mac == MAC and seed.phone_home == PHONE_HOME and seed.dns == ("10.8.0.1",)


def test_with_a_tenant_nic_the_tenant_address_is_primary_and_the_provisioning_one_is_beside_it():
    seed = seed_of(spec(tenant_nic()), config(TESSERA_REDFISH_SERVER_GATEWAY="172.30.9.1"))
    nic = yaml.safe_load(network_config(seed))["ethernets"]["eth0"]
    assert nic["match"] == {"macaddress": MAC}          # the server's NIC, not the tenant attachment's MAC
    assert nic["addresses"] == ["10.8.0.5/24", "172.30.9.10/24"]
    assert nic["routes"] == [{"to": "default", "via": "10.8.0.1"}] and nic["mtu"] == 1450
    assert nic["nameservers"] == {"addresses": ["10.8.0.1"]} and seed.phone_home == PHONE_HOME


def test_the_tenant_networks_mtu_wins_over_the_setting():
    assert seed_of(spec(tenant_nic(mtu=8950))).mtu == 8950
    assert seed_of(spec(tenant_nic()), config(TESSERA_REDFISH_TENANT_MTU="1400")).mtu == 1400


def test_a_tenant_network_overlapping_the_provisioning_network_is_refused():
    with pytest.raises(ValueError, match="overlaps the provisioning network 172.30.9.0/24"):
        seed_of(spec(tenant_nic(ip="172.30.9.77")))


# --- the command's attachment reaches the driver, also without a dataplane --------------------------------------
def test_the_spec_carries_the_tenant_nic_whenever_the_command_carries_an_attachment():
    network = NetworkSnapshot(network_id=uuid.UUID(int=1), name="a", vni=11, cidr="10.8.0.0/24",
                              gateway_ip="10.8.0.1", vrf_table=1)
    saga, allocation, tenant = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    cmd = c.ProvisionNode(
        saga_id=saga, step="provision", idempotency_key=step_key(saga, "provision"), allocation_id=allocation,
        tenant_id=tenant, node_id=uuid.uuid4(), slots=[0],
        attachment=SlotAttachment(attachment_id=uuid.uuid4(), allocation_id=allocation, network_id=network.network_id,
                                  ip_address="10.8.0.5", prefix_len=24, mac_address="02:00:00:00:00:10"),
        tenant_networks=TenantNetworks(tenant_id=tenant, version=1, networks=[network]))
    nic = instance_spec(cmd, None).nic          # None: the MTU a node without a dataplane gives
    assert (nic.ip_address, nic.prefix_len, nic.gateway, nic.mtu) == ("10.8.0.5", 24, "10.8.0.1", None)
    assert tenant_addresses(instance_spec(cmd, None)) == ["10.8.0.5/24"]


# --- what the instance reports -----------------------------------------------------------------------------------
def test_the_instance_reports_the_switch_port_and_guids_on_the_provisioning_network():
    cfg = config(TESSERA_REDFISH_SWITCH_PORT="leaf-07/swp12", TESSERA_REDFISH_HCA_GUIDS=GUID)
    assert network_info(cfg, {"addresses": ["10.8.0.5/24"]}) == {
        "addresses": ["10.8.0.5/24"], "switch_port": {"leaf": "leaf-07", "port": "swp12"}, "hca_guids": [GUID],
        "network_phase": "provisioning"}
    assert network_info(config(), {}) == {"addresses": [], "switch_port": None, "hca_guids": [],
                                          "network_phase": None}


class PoweredOn:
    """sushy's client as ``instance_info`` uses it: a server that is on."""

    def __init__(self, *_args, **_kw):
        pass

    def power_state(self) -> str:
        return "On"

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *_exc):
        self.close()


async def test_the_provision_replys_instance_carries_the_servers_network(tmp_path, monkeypatch):
    monkeypatch.setattr(redfish, "BmcClient", PoweredOn)
    cfg = RedfishConfig.from_env({**BASE, "TESSERA_REDFISH_STATE_DIR": str(tmp_path),
                                  "TESSERA_REDFISH_SWITCH_PORT": "leaf-07/swp12", "TESSERA_REDFISH_HCA_GUIDS": GUID})

    async def bmc():
        return BmcConfig("https://bmc.example", "1", "admin", "secret")
    driver = redfish.RedfishDriver(cfg, bmc_source=bmc)
    node = sim_node(tmp_path, records=FakeNodeRecords(), driver=driver)
    allocation = uuid.uuid4()
    driver.records.save({"allocation_id": str(allocation), "instance_id": instance_id(allocation), "slots": [0],
                         "status": "ready", "addresses": ["10.8.0.5/24"]})
    info = await handlers.instance_info(node, allocation, instance_id(allocation))
    assert info.switch_port == c.SwitchPort(leaf="leaf-07", port="swp12") and info.hca_guids == [GUID]
    assert info.network_phase == "provisioning" and info.addresses == ["10.8.0.5/24"]
    assert info.power_state == "running" and info.driver == "redfish"

