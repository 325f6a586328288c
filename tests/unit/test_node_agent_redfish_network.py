"""A bare-metal server's tenant-side interface: the redfish driver's network settings."""
from __future__ import annotations

import pytest

from services.node_agent.adapters.drivers import DriverConfigError
from services.node_agent.adapters.drivers.redfish.config import RedfishConfig

BASE = {"TESSERA_REDFISH_SERVER_ADDRESS": "172.30.9.10/24"}
GUID = "0x0002c903000e0b72"


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
