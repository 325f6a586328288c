"""``./taskw up``'s bare-metal demo node: one server (a QEMU domain, TCG) behind a real Redfish BMC (sushy-emulator),
on a provisioning bridge of its own, its eight NVMe slots loop devices; the node's agent runs the redfish driver, so
a tenant's ``bm.8gpu`` allocation in the ``baremetal`` pool powers the server on through Redfish, boots the
project's image from virtual media, and on release powers it off, ejects the media and wipes its disks.

The server is cabled to a leaf switch (``tooling.bmc_leaf``) on the VM demo lab's underlay: at hand-off the
network service's leaf driver moves its port from the provisioning VLAN to the tenant network's (the VXLAN VNI the
VM-slice nodes use), and back before the wipe. On a kernel whose bridge cannot filter VLANs the server is on the
provisioning bridge itself, without a leaf, as the redfish driver's tests run it.

It runs with the VM demo lab (root, libvirtd, the guest image) and is made fresh at each start (a new server, BMC,
leaf and bridges): the node keeps its id and its approved slots, its agent gets the new addresses and switch port,
the network service the new leaf, and the gateway the new BMC (``PUT /v1/nodes/{id}/bmc``, the password sealed
with the platform's key). At stop it all goes.
"""
from __future__ import annotations

from pathlib import Path

from .bmc_lab import BmcLab

POOL = "baremetal"
TAINT = {"dedicated": f"{POOL}:NoSchedule"}
TOLERATION = f"dedicated={POOL}:NoSchedule"
WIPE_POLICY = "nvme-secure-erase+discard"   # NVMe format on an NVMe controller; the loop devices get blkdiscard
SLOTS = 8


class DemoBareMetal:
    def __init__(self, workdir: Path, fabric: tuple[str, str] | None = None):
        """``fabric``: (fabric namespace, underlay bridge) of the VM demo lab, where the server's leaf goes."""
        self.workdir = workdir
        self.lab = BmcLab(disks=SLOTS, fabric=fabric)

    def prepare(self) -> None:
        """Make the server, its bridges, leaf, disks and BMC (blocking; raises RuntimeError/OSError when it
        cannot)."""
        self.lab.start()

    def network_env(self) -> dict[str, str]:
        """The network service's settings for this server's leaf (empty without one)."""
        return self.lab.network_env()

    def node_env(self) -> dict[str, str]:
        return self.lab.node_env(self.workdir / "redfish")

    def bmc_body(self) -> dict:
        return self.lab.bmc_body()

    def stop(self) -> None:
        """Remove the server, its BMC, leaf, bridges and disks (never raises)."""
        try:
            self.lab.stop()
        except Exception as exc:   # noqa: BLE001 - a teardown reports and goes on
            print(f"bare-metal demo: teardown: {exc}", flush=True)
