"""The redfish driver's settings (read by ``RedfishConfig.from_env``, in bootstrap; never at import time).

  TESSERA_REDFISH_STATE_DIR       [/var/lib/tessera/redfish] instance records (they survive a restart of the
                                  node-agent), the boot ISOs being served, downloaded kernels
  TESSERA_REDFISH_MEDIA_LISTEN    [127.0.0.1:0] host:port the media server binds (port 0: any free port)
  TESSERA_REDFISH_MEDIA_URL       [http://<listen host>:<actual port>] the base URL the BMC fetches the ISO from
                                  and the server phones home to (set it when they reach the node-agent through
                                  another address, or when listening on 0.0.0.0)
  TESSERA_REDFISH_SERVER_ADDRESS  (required) the server's provisioning address with its prefix, e.g. 172.30.9.10/24
  TESSERA_REDFISH_SERVER_GATEWAY  [] the provisioning network's gateway
  TESSERA_REDFISH_SERVER_MAC      [the first MAC the BMC lists in the system's EthernetInterfaces] the NIC the seed
                                  configures
  TESSERA_REDFISH_TIMEOUTS        [] phase=seconds,... overriding the defaults power_off=60, insert_media=120,
                                  boot_override=30, power_on=60, deploy=300, eject=60
  TESSERA_REDFISH_POLL_S          [0.5] seconds between two reads of the power state while waiting for it
  TESSERA_REDFISH_SWITCH_PORT     [] <leaf>/<port>: the leaf switch and port the server's NIC is cabled to (the
                                  network service moves that port to the tenant's VXLAN at hand-off); reported
                                  on the instance, which is then on the provisioning network until hand-off
  TESSERA_REDFISH_HCA_GUIDS       [] the server's InfiniBand HCA port GUIDs, comma-separated (0x + 16 hex digits,
                                  or the sysfs form 0002:c903:000e:0b72), added to the tenant's partition
  TESSERA_REDFISH_TENANT_MTU      [1450] the MTU of the server's tenant interface when the tenant network gives
                                  none (VXLAN takes 50 bytes of a 1500-byte underlay)
"""
from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from shared.settings import SettingError, load, number, setting

from ..base import DriverConfigError

PHASES = ("power_off", "insert_media", "boot_override", "power_on", "deploy", "eject")
DEFAULT_TIMEOUTS = {"power_off": 60.0, "insert_media": 120.0, "boot_override": 30.0, "power_on": 60.0,
                    "deploy": 300.0, "eject": 60.0}
_MAC = re.compile(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}")
_LEAF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,62}")
_PORT = re.compile(r"[A-Za-z0-9_.:-]{1,15}")
_GUID = re.compile(r"0x[0-9a-f]{16}|[0-9a-f]{4}(:[0-9a-f]{4}){3}")
MAX_HCA_GUIDS = 16


def _timeouts(raw: str) -> dict[str, float]:
    found = dict(DEFAULT_TIMEOUTS)
    for part in filter(None, (p.strip() for p in raw.split(","))):
        phase, sep, seconds = part.partition("=")
        phase = phase.strip()
        if not sep or phase not in PHASES:
            raise ValueError(part)
        value = float(seconds)
        if not value > 0 or value == float("inf"):
            raise ValueError(part)
        found[phase] = value
    return found


_timeouts.what = "phase=seconds pairs, comma-separated, seconds > 0 (phases: " + ", ".join(PHASES) + ")"


def _listen(raw: str) -> tuple[str, int]:
    host, sep, port = raw.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(raw)
    if ":" in host:
        ipaddress.IPv6Address(host)
    return host, int(port)


_listen.what = "host:port (IPv6 as [addr]:port; port 0: any free port)"


def _url(raw: str) -> str:
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in raw):
        raise ValueError(raw)
    return raw.rstrip("/")


_url.what = "an http(s) URL"


def _interface(raw: str) -> ipaddress.IPv4Interface:
    if "/" not in raw:
        raise ValueError(raw)
    found = ipaddress.IPv4Interface(raw)
    if found.network.prefixlen == 32 or found.ip in (found.network.network_address, found.network.broadcast_address):
        raise ValueError(raw)
    return found


_interface.what = "an IPv4 host address with its prefix, e.g. 172.30.9.10/24"


def _address(raw: str) -> ipaddress.IPv4Address:
    return ipaddress.IPv4Address(raw)


_address.what = "an IPv4 address"


def _mac(raw: str) -> str:
    mac = raw.lower()
    if not _MAC.fullmatch(mac):
        raise ValueError(raw)
    return mac


_mac.what = "a MAC address (six colon-separated hex octets)"


def _switch_port(raw: str) -> tuple[str, str]:
    leaf, sep, port = raw.rpartition("/")
    if not sep or not _LEAF.fullmatch(leaf) or not _PORT.fullmatch(port):
        raise ValueError(raw)
    return leaf, port


_switch_port.what = ("<leaf>/<port>: the leaf switch (1-63 of A-Z a-z 0-9 . _ : -, starting alphanumeric) and its "
                     "port's interface name (1-15 of A-Z a-z 0-9 _ . : -), e.g. leaf-07/swp12")


def _hca_guids(raw: str) -> tuple[str, ...]:
    found: list[str] = []
    for part in filter(None, (p.strip().lower() for p in raw.split(","))):
        if not _GUID.fullmatch(part):
            raise ValueError(raw)
        guid = part if part.startswith("0x") else "0x" + part.replace(":", "")
        if guid in found:
            raise ValueError(raw)
        found.append(guid)
    if len(found) > MAX_HCA_GUIDS:
        raise ValueError(raw)
    return tuple(found)


_hca_guids.what = (f"up to {MAX_HCA_GUIDS} distinct InfiniBand GUIDs, comma-separated (0x + 16 hex digits, or "
                   "0002:c903:000e:0b72)")


def _mtu(raw: str) -> int:
    value = int(raw)
    if not 576 <= value <= 9216:
        raise ValueError(raw)
    return value


_mtu.what = "an MTU, 576-9216"


@dataclass(frozen=True)
class RedfishConfig:
    state_dir: Path = setting("TESSERA_REDFISH_STATE_DIR", Path("/var/lib/tessera/redfish"), Path,
                              doc="instance records, the boot ISOs served, downloaded kernels")
    media_listen: tuple[str, int] = setting("TESSERA_REDFISH_MEDIA_LISTEN", ("127.0.0.1", 0), _listen,
                                            doc="host:port of the media server (port 0: any free port)")
    media_url: str | None = setting("TESSERA_REDFISH_MEDIA_URL", None, _url,
                                    doc="base URL the BMC and the server reach the media server at")
    server_address: ipaddress.IPv4Interface | None = setting(
        "TESSERA_REDFISH_SERVER_ADDRESS", None, _interface, doc="the server's provisioning address/prefix (required)")
    server_gateway: ipaddress.IPv4Address | None = setting("TESSERA_REDFISH_SERVER_GATEWAY", None, _address,
                                                           doc="the provisioning network's gateway")
    server_mac: str | None = setting("TESSERA_REDFISH_SERVER_MAC", None, _mac,
                                     doc="the server's provisioning NIC (default: the BMC's first)")
    timeouts: dict[str, float] = setting("TESSERA_REDFISH_TIMEOUTS", read=_timeouts,
                                         default_factory=lambda: dict(DEFAULT_TIMEOUTS),
                                         doc="phase=seconds,... over the default phase timeouts")
    poll_s: float = setting("TESSERA_REDFISH_POLL_S", 0.5, number(positive=True),
                            doc="seconds between reads of the power state")
    switch_port: tuple[str, str] | None = setting("TESSERA_REDFISH_SWITCH_PORT", None, _switch_port,
                                                  doc="<leaf>/<port> the server's NIC is cabled to")
    hca_guids: tuple[str, ...] = setting("TESSERA_REDFISH_HCA_GUIDS", (), _hca_guids,
                                         doc="the server's InfiniBand HCA port GUIDs, comma-separated")
    tenant_mtu: int = setting("TESSERA_REDFISH_TENANT_MTU", 1450, _mtu,
                              doc="the tenant interface's MTU when the tenant network gives none")

    @classmethod
    def from_env(cls, environ: Mapping[str, str], **overrides) -> RedfishConfig:
        """The settings from ``environ`` (``overrides`` win); raises DriverConfigError naming the variable."""
        try:
            config = load(cls, environ, **overrides)
        except SettingError as exc:
            raise DriverConfigError(str(exc)) from None
        config.check()
        return config

    def check(self) -> None:
        """What no single variable can tell; raises DriverConfigError naming the variable."""
        if self.server_address is None:
            raise DriverConfigError("TESSERA_REDFISH_SERVER_ADDRESS is required: the server's provisioning "
                                    "address with its prefix, e.g. 172.30.9.10/24")
        if self.server_gateway is not None and self.server_gateway not in self.server_address.network:
            raise DriverConfigError(f"TESSERA_REDFISH_SERVER_GATEWAY={self.server_gateway} is outside "
                                    f"TESSERA_REDFISH_SERVER_ADDRESS's network {self.server_address.network}")
        if self.media_url is None and self.media_listen[0] in ("0.0.0.0", "::"):
            raise DriverConfigError("TESSERA_REDFISH_MEDIA_URL is required when TESSERA_REDFISH_MEDIA_LISTEN "
                                    f"binds every address ({self.media_listen[0]}): the BMC needs one to fetch from")
        missing = set(PHASES) - set(self.timeouts)
        if missing:
            raise DriverConfigError(f"TESSERA_REDFISH_TIMEOUTS lacks {', '.join(sorted(missing))}")

    def timeout(self, phase: str) -> float:
        return self.timeouts[phase]

    @property
    def records_dir(self) -> Path:
        return self.state_dir / "instances"

    @property
    def media_dir(self) -> Path:
        return self.state_dir / "media"

    @property
    def images_dir(self) -> Path:
        return self.state_dir / "images"
