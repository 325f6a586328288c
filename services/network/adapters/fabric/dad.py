"""Duplicate address detection on a Linux leaf: before a bare-metal server's port joins its tenant network, is the
server's address already answered for on that network (another host of the tenant holding it)?

An ARP probe (RFC 5227: sender address 0.0.0.0, so no host learns anything from it) sent into the network's VLAN
bridge on the leaf from a veth made for the purpose, which floods over the VXLAN segment to every node carrying the
network; any ARP reply for the address names the MAC holding it. Three probes, 100 ms apart, then 300 ms more of
listening (shorter than RFC 5227's seconds: the probe runs inside the hand-off step, and the segment is a data
centre's, not a Wi-Fi's). The veth is removed whatever happens.
"""
from __future__ import annotations

import sys

from .leafshell import run

PROBE_SEND, PROBE_PEER = "tdad0", "tdad1"
PROBE = """
import os, select, socket, sys, time
ifname, target = sys.argv[1], socket.inet_aton(sys.argv[2])
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0806)); s.bind((ifname, 0))
mac = bytes([0x02]) + os.urandom(5)
probe = b"\\xff" * 6 + mac + b"\\x08\\x06" + bytes.fromhex("0001080006040001") + mac + b"\\x00" * 10 + target
end = time.monotonic() + 0.6
for sent in range(3):
    s.send(probe)
    until = min(end, time.monotonic() + 0.1) if sent < 2 else end
    while (left := until - time.monotonic()) > 0:
        if not select.select([s], [], [], left)[0]:
            break
        frame = s.recv(128)
        if frame[12:14] == b"\\x08\\x06" and frame[20:22] == b"\\x00\\x02" and frame[28:32] == target:
            print(":".join(f"{b:02x}" for b in frame[22:28])); sys.exit(3)
"""


async def address_in_use(leaf: str, ns: str, bridge: str, address: str) -> str | None:
    """The MAC answering for ``address`` in ``bridge`` of the leaf, or None when none does. Raises FabricRefused
    when the probe cannot run."""
    await run(leaf, ns, ["ip", "link", "add", PROBE_SEND, "type", "veth", "peer", "name", PROBE_PEER])
    try:
        await run(leaf, ns, ["ip", "link", "set", PROBE_SEND, "master", bridge, "up"])
        await run(leaf, ns, ["ip", "link", "set", PROBE_PEER, "up"])
        answer = await run(leaf, ns, [sys.executable, "-c", PROBE, PROBE_PEER, address], ok=(0, 3))
        return answer.strip() or None
    finally:
        await run(leaf, ns, ["ip", "link", "del", PROBE_SEND], ok=None)
