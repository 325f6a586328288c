"""``./taskw up``'s bare-metal demo node: one server (a QEMU domain, TCG) behind a real Redfish BMC (sushy-emulator),
on a provisioning bridge of its own, its eight NVMe slots loop devices; the node's agent runs the redfish driver, so
a tenant's ``bm.8gpu`` allocation in the ``baremetal`` pool powers the server on through Redfish, boots the
project's image from virtual media, and on release powers it off, ejects the media and wipes its disks.

It runs with the VM demo lab (root, libvirtd, the guest image) and is made fresh at each start (a new server, BMC
and bridge): the node keeps its id and its approved slots, its agent gets the new addresses, and the gateway the
new BMC (``PUT /v1/nodes/{id}/bmc``, the password sealed with the platform's key). At stop it all goes.
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
    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.lab = BmcLab(disks=SLOTS)

    def prepare(self) -> None:
        """Make the server, its bridge, disks and BMC (blocking; raises RuntimeError/OSError when it cannot)."""
        self.lab.start()

    def node_env(self) -> dict[str, str]:
        return self.lab.node_env(self.workdir / "redfish")

    def bmc_body(self) -> dict:
        return self.lab.bmc_body()

    def stop(self) -> None:
        """Remove the server, its BMC, bridge and disks (never raises)."""
        try:
            self.lab.stop()
        except Exception as exc:   # noqa: BLE001 - a teardown reports and goes on
            print(f"bare-metal demo: teardown: {exc}", flush=True)
