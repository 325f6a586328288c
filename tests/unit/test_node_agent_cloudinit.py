"""The NoCloud seed documents: what cloud-init reads as YAML (checked with PyYAML, as a stand-in for the
parser cloud-init uses), one value per line for the busybox guest, and the boot-outcome console lines."""
from __future__ import annotations

import dataclasses
import shutil
import subprocess

import pytest
import yaml

from services.node_agent.domain.vm.cloudinit import (
    CLOUD_INIT_MARKERS,
    FAILED_MARKER,
    READY_MARKER,
    Seed,
    meta_data,
    network_config,
    parse_failed_line,
    parse_ready_line,
    user_data,
)
from tests.support.guest import init_functions

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPkwkc3pKUFf7lcLJsuO6Ogbe0QVUwr7GdtMusmCb17o alice@example"


def seed(**over) -> Seed:
    base = dict(instance_id="i-0a1b2c", hostname="gpu-node-1", ssh_keys=(KEY,), mac="52:54:00:12:34:56",
                ip_address="10.254.3.10", prefix_len=24, gateway="10.254.3.1", dns=("10.254.3.1", "1.1.1.1"))
    return Seed(**{**base, **over})


def test_meta_data_names_the_instance_and_its_hostname():
    assert yaml.safe_load(meta_data(seed())) == {"instance-id": "i-0a1b2c", "local-hostname": "gpu-node-1"}


def test_user_data_is_a_cloud_config_with_hostname_and_keys_only():
    text = user_data(seed(ssh_keys=(KEY, KEY + "2")))
    assert text.splitlines()[0] == "#cloud-config"
    assert yaml.safe_load(text) == {"hostname": "gpu-node-1", "ssh_authorized_keys": [KEY, KEY + "2"]}


def test_user_data_without_keys_has_no_key_list():
    assert yaml.safe_load(user_data(seed(ssh_keys=()))) == {"hostname": "gpu-node-1"}


@pytest.mark.parametrize("comment", ['say "hi"', "back\\slash", "it's # not: a [comment] {x} & *y !z | >",
                                     "  spaced  ", "ünïcødé ☃", "- dash", "%percent @at `tick`"])
def test_any_printable_key_comment_survives_yaml(comment):
    key = f"{KEY} {comment}"
    assert yaml.safe_load(user_data(seed(ssh_keys=(key,))))["ssh_authorized_keys"] == [key]


@pytest.mark.parametrize("bad", ["a\nb", "a\rb", "a\tb", "a\x00b", "a\x1bb", "a\x7fb", "a\x85b", "a\u2028b",
                                 "a\u2029b", "a\ufeffb", "", "   "])
def test_a_key_with_a_line_break_or_control_character_is_refused(bad):
    with pytest.raises(ValueError):
        seed(ssh_keys=(KEY, bad))


def test_network_config_is_version_2_with_a_default_route_not_gateway4():
    cfg = yaml.safe_load(network_config(seed(ifname="ens3")))
    assert cfg == {"version": 2, "ethernets": {"ens3": {
        "match": {"macaddress": "52:54:00:12:34:56"}, "set-name": "ens3", "addresses": ["10.254.3.10/24"],
        "routes": [{"to": "default", "via": "10.254.3.1"}],
        "nameservers": {"addresses": ["10.254.3.1", "1.1.1.1"]}}}}
    assert "gateway4" not in network_config(seed())


def test_network_config_without_gateway_or_dns_has_no_routes_or_nameservers():
    cfg = yaml.safe_load(network_config(seed(gateway=None, dns=())))
    assert set(cfg["ethernets"]["eth0"]) == {"match", "set-name", "addresses"}


def test_every_document_has_one_value_per_line():
    for text in (meta_data(seed()), user_data(seed()), network_config(seed())):
        for line in text.splitlines():
            if line.startswith("#") or line == "version: 2":
                continue
            value = line.split(": ", 1)[1] if ": " in line else line.strip().removeprefix("- ")
            assert value.endswith(":") or (value.startswith('"') and value.endswith('"')), line


def test_mac_is_normalised_to_lower_case():
    assert seed(mac="52:54:00:AB:CD:EF").mac == "52:54:00:ab:cd:ef"


@pytest.mark.parametrize("over", [
    {"instance_id": ""}, {"instance_id": "has space"}, {"instance_id": "-leading"}, {"instance_id": "a\nb"},
    {"instance_id": "x" * 129}, {"hostname": "bad_host"}, {"hostname": "-x"}, {"hostname": "a..b"},
    {"hostname": "x" * 64}, {"hostname": ""}, {"mac": "52:54:00:12:34"}, {"mac": "52-54-00-12-34-56"},
    {"ip_address": "10.254.3.300"}, {"ip_address": "fe80::1"}, {"prefix_len": 0}, {"prefix_len": 33},
    {"gateway": "10.9.9.1"}, {"gateway": "nope"}, {"dns": ("8.8.8.8", "x")}, {"ifname": "a" * 16},
    {"ifname": "eth 0"}, {"ifname": 'eth"0'}, {"ssh_keys": KEY},
])
def test_invalid_seed_fields_are_refused(over):
    with pytest.raises(ValueError):
        seed(**over)


def test_seed_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        seed().hostname = "other"


def test_ready_line_is_parsed_even_behind_console_noise():
    line = "\r[   8.1] TESSERA-READY instance=i-0a1b2c hostname=gpu-node-1 ip=10.254.3.10/24 mac=52:54:00:12:34:56"
    assert parse_ready_line(line) == {"instance": "i-0a1b2c", "hostname": "gpu-node-1", "ip": "10.254.3.10/24",
                                      "mac": "52:54:00:12:34:56"}
    assert line.find(READY_MARKER) > 0


@pytest.mark.parametrize("line", ["", "random kernel line", "TESSERA-READY instance=i-1 hostname=h ip=1.2.3.4/24",
                                  "TESSERA-READY", "TESSERA-FAILED reason=no-seed-cdrom",
                                  "Cloud-init v. 23.1 running 'modules:final' at Tue, 25 Apr 2017. Up 22.15 seconds."])
def test_other_lines_are_not_ready(line):
    assert parse_ready_line(line) is None


def test_cloud_init_final_message_counts_as_ready():
    line = ("[  22.3] cloud-init[812]: Cloud-init v. 23.1.2-0ubuntu0~22.04.1 finished at Tue, 25 Apr 2017 13:42:42 "
            "+0000. Datasource DataSourceNoCloud [seed=/dev/sr0][dsmode=net].  Up 22.27 seconds")
    assert any(p.search(line) for p in CLOUD_INIT_MARKERS)
    assert parse_ready_line(line) == {"cloud_init": "23.1.2-0ubuntu0~22.04.1",
                                      "datasource": "DataSourceNoCloud [seed=/dev/sr0][dsmode=net]"}


def test_failed_line_gives_its_reason():
    assert parse_failed_line(f"{FAILED_MARKER} reason=no-nic-with-mac-52:54:00:12:34:56") == "no-nic-with-mac-52:54:00:12:34:56"
    assert parse_failed_line(FAILED_MARKER) == "unknown"
    assert parse_failed_line("TESSERA-READY instance=a hostname=b ip=c mac=d") is None


def test_the_network_config_carries_the_tenant_networks_mtu_when_given():
    from services.node_agent.domain.vm.cloudinit import Seed, network_config
    base = dict(instance_id="i-1", hostname="h", ssh_keys=(), mac="52:54:00:00:00:01", ip_address="10.0.0.5",
                prefix_len=24, gateway="10.0.0.1")
    assert "    mtu: 1450\n" in network_config(Seed(**base, mtu=1450))
    assert "mtu" not in network_config(Seed(**base))
    with pytest.raises(ValueError, match="mtu"):
        Seed(**base, mtu=100)


def test_user_data_carries_cloud_inits_phone_home_when_given():
    url = "http://172.30.9.1:8080/phone-home/Ab_c-1"
    text = user_data(seed(phone_home=url))
    assert yaml.safe_load(text)["phone_home"] == {"url": url, "post": ["instance_id", "hostname"], "tries": 10}
    assert [line for line in text.splitlines() if line.startswith("  url:")] == [f'  url: "{url}"']


def test_user_data_without_phone_home_has_none():
    assert "phone_home" not in user_data(seed())
    assert "phone_home" not in yaml.safe_load(user_data(seed(phone_home=None)))


@pytest.mark.parametrize("bad", ["", "ftp://host/x", "http://", "/phone-home/x", "host:80/x", "http://h/a b",
                                 "http://h/a\nb", "http://h/\x00", "http://h:99999/x", "javascript:alert(1)"])
def test_a_phone_home_that_is_not_a_printable_http_url_is_refused(bad):
    with pytest.raises(ValueError, match="phone_home"):
        seed(phone_home=bad)


# --- more than one address on the NIC (a bare-metal server: its tenant address, then its provisioning one) ---------
def test_extra_addresses_follow_the_primary_in_the_network_configs_address_list():
    text = network_config(seed(mtu=1450, extra_addresses=("172.30.9.10/24",)))
    nic = yaml.safe_load(text)["ethernets"]["eth0"]
    assert nic["addresses"] == ["10.254.3.10/24", "172.30.9.10/24"]
    assert nic["mtu"] == 1450 and nic["routes"] == [{"to": "default", "via": "10.254.3.1"}]
    assert seed().extra_addresses == () and yaml.safe_load(network_config(seed()))["ethernets"]["eth0"][
        "addresses"] == ["10.254.3.10/24"]


@pytest.mark.parametrize("bad", [("172.30.9.10",), ("172.30.9.10/0",), ("172.30.9.10/33",), ("fe80::1/64",),
                                 ("172.30.9.300/24",), ("10.254.3.10/16",), ("1.2.3.4/24", "1.2.3.4/25"),
                                 ("172.30.9.10/24\n",), "172.30.9.10/24"])
def test_an_extra_address_that_is_not_a_distinct_ipv4_address_with_its_prefix_is_refused(bad):
    with pytest.raises(ValueError, match="address"):
        seed(extra_addresses=bad)


@pytest.mark.skipif(not shutil.which("busybox"), reason="the guest's shell is busybox sh")
@pytest.mark.parametrize("extra", [(), ("172.30.9.10/24",), ("172.30.9.10/24", "192.168.7.2/30")])
def test_the_guest_init_adds_every_address_primary_first_and_reports_the_primary(tmp_path, extra):
    """The init's own functions under busybox sh, ``ip`` and ``fail`` stood in for: the commands it would run."""
    (tmp_path / "network-config").write_text(network_config(seed(mtu=1450, extra_addresses=extra)))
    script = init_functions("netcfg", "read_netcfg", "configure_nic") + (
        'ip() { echo "ip $*"; }\nfail() { echo "FAILED $*"; exit 1; }\n'
        'read_netcfg network-config; configure_nic eth0; echo "primary $addr mac $mac dns$dns"\n')
    proc = subprocess.run(["busybox", "sh", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == [
        "ip link set eth0 mtu 1450",
        *(f"ip addr add {a} dev eth0" for a in ("10.254.3.10/24", *extra)),
        "ip link set eth0 up",
        "ip route add default via 10.254.3.1 dev eth0 onlink",
        "primary 10.254.3.10/24 mac 52:54:00:12:34:56 dns 10.254.3.1 1.1.1.1"]
