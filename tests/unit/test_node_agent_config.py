"""The node-agent's configuration: its node id and its driver, from the environment (pure)."""
from __future__ import annotations

import uuid

import pytest

from services.node_agent.adapters.drivers import SimDriver
from services.node_agent.bootstrap import build, build_driver
from services.node_agent.settings import load_settings, node_id_from_env, parse_node_id
from shared.settings import ServiceSettings, SettingError


def test_node_id_is_read_from_tessera_node_id_or_tessera_instance():
    node = str(uuid.uuid4())
    assert node_id_from_env({"TESSERA_NODE_ID": node}) == node
    assert node_id_from_env({"TESSERA_INSTANCE": node}) == node
    assert node_id_from_env({"TESSERA_NODE_ID": node, "TESSERA_INSTANCE": node.upper()}) == node
    assert node_id_from_env({}) is None


def test_disagreeing_node_id_variables_are_refused():
    with pytest.raises(SettingError, match="disagree"):
        node_id_from_env({"TESSERA_NODE_ID": str(uuid.uuid4()), "TESSERA_INSTANCE": str(uuid.uuid4())})


@pytest.mark.parametrize("value", [None, "", "0", "node-7", "1234"])
def test_missing_or_malformed_node_id_is_a_config_error_naming_the_variable(value):
    with pytest.raises(SettingError, match="TESSERA_NODE_ID"):
        parse_node_id(value)


def test_node_id_is_normalised_to_a_uuid():
    node = uuid.uuid4()
    assert parse_node_id(str(node).upper()) == node


def test_driver_defaults_to_sim_and_receives_its_own_variables():
    assert isinstance(build_driver(load_settings({}).driver, {}), SimDriver)
    driver = build_driver("sim", {"TESSERA_NODE_DRIVER": "sim", "TESSERA_SIM_FAIL": "provision"})
    assert driver.fail == {"provision"}


def test_unknown_driver_name_is_a_config_error_listing_the_known_ones():
    with pytest.raises(SettingError, match=r"TESSERA_NODE_DRIVER='ipmi'.*\['libvirt', 'redfish', 'sim'\]"):
        load_settings({"TESSERA_NODE_DRIVER": "ipmi"})


def test_bad_driver_variables_surface_as_config_errors():
    with pytest.raises(SettingError, match="TESSERA_SIM_LATENCY_S"):
        build_driver("sim", {"TESSERA_SIM_LATENCY_S": "soon"})


def test_build_refuses_settings_whose_instance_is_not_a_node_uuid():
    with pytest.raises(SettingError, match="TESSERA_NODE_ID"):
        build(ServiceSettings(service="node_agent", instance="0"), environ={})


def test_build_reads_the_node_id_from_tessera_node_id_without_connecting():
    node = uuid.uuid4()
    rt = build(environ={"TESSERA_NODE_ID": str(node)})
    assert rt.settings.instance == str(node)
    assert rt.consumers.names == [f"node_agent_{node.hex}__{n}" for n in (
        "provision", "deprovision", "power", "wipe_slots", "fence_node", "rewipe", "burn_in", "set_bmc",
        "mount_volume", "unmount_volume", "inject_fault", "fence_instances")]
    assert [(t, p) for t, _, p in rt.responders] == [("node_agent.validate_bmc", {"node_id": str(node)}),
                                                      ("node_agent.read_console", {"node_id": str(node)})]
