"""The NoCloud seed of a VM slice (``meta-data``, ``user-data``, ``network-config``) and the console
lines that tell a boot's outcome. Pure: no I/O.

The documents are rendered by hand, one value per line and every string double-quoted, so that a real
cloud-init reads them as YAML and the project's busybox guest (``tooling/guest_image/init``) reads them
with sed and awk. Only ``\\`` and ``"`` are ever escaped: anything that is not a printable character
(newlines, tabs, other control or format characters) is refused with ValueError instead.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

READY_MARKER = "TESSERA-READY"
FAILED_MARKER = "TESSERA-FAILED"
# cloud-init's default final_message, printed on the console by real cloud images when every stage has run
# ("Cloud-init v. {version} finished at {timestamp}. Datasource {datasource}.  Up {uptime} seconds"), e.g.
# "Cloud-init v. 23.1.2 finished at Tue, 25 Apr 2017 13:42:42 +0000. Datasource DataSourceNoCloud [seed=/dev/sr0][dsmode=net].
#  Up 22.27 seconds" (one line). Matched anywhere in a console line.
CLOUD_INIT_MARKERS: tuple[re.Pattern[str], ...] = (
    re.compile(r"Cloud-init v\. (?P<version>\S+) finished at (?P<at>.+?)\. "
               r"Datasource (?P<datasource>.*?)\.\s+Up (?P<uptime>[\d.]+) seconds"),
)

_INSTANCE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}")
_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
_MAC = re.compile(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}")
_IFNAME = re.compile(r"[A-Za-z0-9_.-]{1,15}")
_READY_FIELDS = ("instance", "hostname", "ip", "mac")
_MOUNT_TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,35}")
_MOUNT_POINT = re.compile(r"/mnt/[a-z0-9][a-z0-9-]{0,62}")
PHONE_HOME_TRIES = 10


@dataclass(frozen=True)
class GuestMount:
    """A virtiofs volume the guest mounts at boot: cloud-init's ``mounts`` entry
    ``[tag, mount point, "virtiofs", "defaults" or "ro", "0", "0"]`` (cloud-init writes it to fstab, makes the
    mount point and mounts it; the project's guest init does the same before its ready line)."""
    tag: str
    mount_point: str
    read_only: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.tag, str) or not _MOUNT_TAG.fullmatch(self.tag):
            raise ValueError(f"mount tag {self.tag!r}: 1-36 of A-Z a-z 0-9 _ . -, starting alphanumeric")
        if not isinstance(self.mount_point, str) or not _MOUNT_POINT.fullmatch(self.mount_point):
            raise ValueError(f"mount point {self.mount_point!r} is not /mnt/<volume name>")

    def entry(self) -> list[str]:
        return [self.tag, self.mount_point, "virtiofs", "ro" if self.read_only else "defaults", "0", "0"]


@dataclass(frozen=True)
class Seed:
    """What one instance is told at its first boot. Validated on construction (ValueError)."""
    instance_id: str
    hostname: str
    ssh_keys: tuple[str, ...]
    mac: str
    ip_address: str
    prefix_len: int
    gateway: str | None
    dns: tuple[str, ...] = ()
    ifname: str = "eth0"
    mtu: int | None = None   # the tenant network's MTU (VXLAN takes 50 bytes of the underlay's)
    # where the guest POSTs instance_id, hostname (and ip) once it is ready (cloud-init's phone_home module);
    # bare-metal servers report this way, VMs leave it None (their ready line is on a console the node reads)
    phone_home: str | None = None
    mounts: tuple[GuestMount, ...] = ()      # the allocation's virtiofs volumes, mounted before the ready line
    # more "a.b.c.d/len" on the same NIC, after the primary (which stays the one reported): a bare-metal server
    # keeps its provisioning address, on-link, to phone home over while its primary is the tenant's
    extra_addresses: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not _INSTANCE_ID.fullmatch(self.instance_id):
            raise ValueError(f"instance id {self.instance_id!r}: 1-128 of A-Z a-z 0-9 . _ : @ + -, starting alphanumeric")
        _check_hostname(self.hostname)
        if isinstance(self.ssh_keys, str):
            raise ValueError("ssh_keys is a tuple of keys, not one string")
        for key in self.ssh_keys:
            _check_text("ssh key", key)
        object.__setattr__(self, "ssh_keys", tuple(self.ssh_keys))
        mac = str(self.mac).lower()
        if not _MAC.fullmatch(mac):
            raise ValueError(f"mac {self.mac!r} is not six colon-separated hex octets")
        object.__setattr__(self, "mac", mac)
        addr = _ipv4("ip_address", self.ip_address)
        object.__setattr__(self, "ip_address", str(addr))
        if not isinstance(self.prefix_len, int) or not 0 < self.prefix_len <= 32:
            raise ValueError(f"prefix_len {self.prefix_len!r} is not 1-32")
        if self.gateway is not None:
            gw = _ipv4("gateway", self.gateway)
            if gw not in ipaddress.IPv4Interface(f"{addr}/{self.prefix_len}").network:
                raise ValueError(f"gateway {gw} is outside {addr}/{self.prefix_len}")
            object.__setattr__(self, "gateway", str(gw))
        object.__setattr__(self, "dns", tuple(str(_ipv4("dns", d)) for d in self.dns))
        if self.mtu is not None and (not isinstance(self.mtu, int) or not 576 <= self.mtu <= 9216):
            raise ValueError(f"mtu {self.mtu!r} is not 576-9216")
        if not _IFNAME.fullmatch(self.ifname):
            raise ValueError(f"ifname {self.ifname!r} is not a Linux interface name (1-15 of A-Z a-z 0-9 _ . -)")
        if self.phone_home is not None:
            _check_url("phone_home", self.phone_home)
        object.__setattr__(self, "mounts", tuple(self.mounts))
        if not all(isinstance(m, GuestMount) for m in self.mounts):
            raise ValueError("mounts are GuestMount entries")
        if isinstance(self.extra_addresses, str):
            raise ValueError("extra_addresses is a tuple of a.b.c.d/len, not one string")
        extra = tuple(_interface("extra address", a) for a in self.extra_addresses)
        if len({a.ip for a in extra} | {addr}) != len(extra) + 1:
            raise ValueError(f"an address is given twice: {[str(a) for a in extra]} (primary {addr})")
        object.__setattr__(self, "extra_addresses", tuple(str(a) for a in extra))


def meta_data(seed: Seed) -> str:
    """The NoCloud ``meta-data`` document."""
    return f"instance-id: {_q(seed.instance_id)}\nlocal-hostname: {_q(seed.hostname)}\n"


def user_data(seed: Seed) -> str:
    """The ``user-data`` document: a ``#cloud-config`` with the hostname, the authorised SSH keys, the
    volumes to mount (cloud-init's ``mounts``, one flow list per line) and, when the seed has one, cloud-init's
    ``phone_home`` (url, the fields to post, the number of tries)."""
    lines = ["#cloud-config", f"hostname: {_q(seed.hostname)}"]
    if seed.ssh_keys:
        lines.append("ssh_authorized_keys:")
        lines += [f"  - {_q(key)}" for key in seed.ssh_keys]
    if seed.mounts:
        lines.append("mounts:")
        lines += ["  - [" + ", ".join(_q(field) for field in m.entry()) + "]" for m in seed.mounts]
    if seed.phone_home is not None:
        lines += ["phone_home:", f"  url: {_q(seed.phone_home)}", '  post: ["instance_id", "hostname"]',
                  f"  tries: {PHONE_HOME_TRIES}"]
    return "\n".join(lines) + "\n"


def network_config(seed: Seed) -> str:
    """The ``network-config`` document: network config version 2 (netplan's format), one static NIC
    matched by MAC, its addresses (the primary first, then the extra ones), a default route
    (``routes: [{to: default, via: ...}]``; ``gateway4`` is deprecated)."""
    lines = [
        "version: 2",
        "ethernets:",
        f"  {seed.ifname}:",
        "    match:",
        f"      macaddress: {_q(seed.mac)}",
        f"    set-name: {_q(seed.ifname)}",
        *([f"    mtu: {seed.mtu}"] if seed.mtu is not None else []),
        "    addresses:",
        f"      - {_q(f'{seed.ip_address}/{seed.prefix_len}')}",
        *(f"      - {_q(a)}" for a in seed.extra_addresses),
    ]
    if seed.gateway is not None:
        lines += ["    routes:", f"      - to: {_q('default')}", f"        via: {_q(seed.gateway)}"]
    if seed.dns:
        lines += ["    nameservers:", "      addresses:"] + [f"        - {_q(d)}" for d in seed.dns]
    return "\n".join(lines) + "\n"


def parse_ready_line(line: str) -> dict[str, str] | None:
    """The fields of a boot-finished console line, or None when ``line`` is not one.

    A ``TESSERA-READY instance=.. hostname=.. ip=.. mac=..`` line (anywhere in ``line``: the console may
    prefix it) gives ``{"instance", "hostname", "ip", "mac"}``; cloud-init's final message gives
    ``{"cloud_init", "datasource"}``. A ``TESSERA-FAILED`` line is not ready: see ``parse_failed_line``.
    """
    at = line.find(READY_MARKER + " ")
    if at >= 0:
        fields = dict(part.split("=", 1) for part in line[at + len(READY_MARKER):].split() if "=" in part)
        if all(fields.get(k) for k in _READY_FIELDS):
            return {k: fields[k] for k in _READY_FIELDS}
        return None
    for pattern in CLOUD_INIT_MARKERS:
        m = pattern.search(line)
        if m:
            return {"cloud_init": m["version"], "datasource": m["datasource"]}
    return None


def parse_failed_line(line: str) -> str | None:
    """The reason of a ``TESSERA-FAILED reason=...`` console line, or None when ``line`` is not one."""
    at = line.find(FAILED_MARKER)
    if at < 0:
        return None
    rest = line[at + len(FAILED_MARKER):].strip()
    return rest.removeprefix("reason=").strip() or "unknown"


def _q(text: str) -> str:
    """``text`` as a YAML double-quoted scalar (callers have refused non-printable characters)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _check_text(what: str, text: str) -> None:
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{what} is empty")
    # isprintable() is False for newlines, tabs, C0/C1 controls and the separators YAML treats as line breaks
    # (U+0085, U+2028, U+2029): none of them can be written on one line.
    bad = next((ch for ch in text if not ch.isprintable()), None)
    if bad is not None:
        raise ValueError(f"{what} contains the non-printable character {bad!r}")


def _check_url(what: str, url: str) -> None:
    """An absolute http(s) URL with a host, printable and without whitespace (it is one shell word in the guest)."""
    _check_text(what, url)
    if any(ch.isspace() for ch in url):
        raise ValueError(f"{what} {url!r} contains whitespace")
    try:
        parts = urlsplit(url)
        parts.port   # noqa: B018 - raises ValueError for a bad port
    except ValueError as exc:
        raise ValueError(f"{what} {url!r} is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{what} {url!r} is not an http(s) URL with a host")


def _check_hostname(name: str) -> None:
    if not isinstance(name, str) or not 0 < len(name) <= 253 or not all(_HOST_LABEL.fullmatch(p) for p in name.split(".")):
        raise ValueError(f"hostname {name!r} is not an RFC 1123 host name")


def _interface(what: str, value: str) -> ipaddress.IPv4Interface:
    """``value`` as "a.b.c.d/len" (len 1-32); ValueError naming ``what`` otherwise."""
    address, sep, prefix = str(value).partition("/")
    if not sep or not prefix.isdigit() or not 0 < int(prefix) <= 32:
        raise ValueError(f"{what} {value!r} is not a.b.c.d/len (len 1-32)")
    return ipaddress.IPv4Interface(f"{_ipv4(what, address)}/{int(prefix)}")


def _ipv4(what: str, value: str) -> ipaddress.IPv4Address:
    try:
        return ipaddress.IPv4Address(value)
    except (ipaddress.AddressValueError, ValueError) as exc:
        raise ValueError(f"{what} {value!r} is not an IPv4 address") from exc
