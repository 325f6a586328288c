"""`./taskw bench:baremetal` — not a test. Bare metal end to end: N allocations (default 5) of `bm.8gpu`, one after
the other (the lab has one server), through the gateway, the saga and a node-agent running the redfish driver
against a real sushy-emulator BMC whose server is a QEMU domain (TCG) booting the project's image from virtual
media; each is released, which powers the server off, ejects the media and wipes its eight disks (loop devices
of --disk-mib MiB, filled with data before each release). Needs root.

Per allocation: request → ACTIVE (the allocation's ``updated_at`` at ACTIVE minus the time just before the POST),
the driver's phases (power_off, insert_media, boot_override, power_on, deploy: the allocation's ``instance.phases``)
and the move of the server's switch port to its tenant network (``port_to_tenant``: the kernel leaf driver on a Linux
leaf in a namespace), the Redfish calls it made, release → RELEASED with the port's move back to the provisioning
network (``port_to_provisioning``), and the wipe evidence (bytes and seconds per disk).

Baselines in the same run: for the port moves, ``ip link set swp1 master <bridge>`` on the leaf by hand (the server
off); on the same loop devices with the same data written first and the server off:
``blkdiscard <dev>`` and ``dd if=/dev/zero of=<dev> bs=4M oflag=direct`` — what an operator would run by hand —
timed per device, one after the other. Ratios: per disk, the wipe's throughput (a disk's bytes over its seconds,
verification included, while the node wipes its eight slots at once) over each baseline's; for the whole node
(``wipe_all_*``), every disk's bytes over the step's wall time (the slowest slot) against every disk's bytes over
the sum of the baseline's times.
``--no-leaf`` puts the server on the provisioning bridge itself (no leaf, no port move), for comparison.
The last line is one JSON object with every figure.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path

from services.node_agent.adapters.dataplane.lab import Lab
from tests.bench.common import pct, work_dir
from tests.support import vm
from tests.support.disks import fill_pattern
from tests.support.platform import E2E_ENV
from tooling.bmc_lab import BmcLab
from tooling.client import TesseraClient
from tooling.platform import Platform

PHASES = ("power_off", "insert_media", "boot_override", "power_on", "deploy", "port_to_tenant")
RELEASE_PHASES = ("port_to_provisioning",)
POLICY = "nvme-secure-erase+discard"


def say(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


def epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def timed(*argv: str) -> float:
    started = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    return time.perf_counter() - started


def baselines(devices: list[str], size: int) -> dict:
    """blkdiscard and dd of zeros on each device after the same data was written, one device after the other (as
    an operator would by hand): MB/s per device, and all the devices' bytes over the sum of their times."""
    discard, dd = [], []
    for dev in devices:
        fill_pattern(dev)
        discard.append(size / timed("blkdiscard", dev) / 1e6)
        fill_pattern(dev)
        dd.append(size / timed("dd", "if=/dev/zero", f"of={dev}", "bs=4M", f"count={size // (4 << 20)}", "oflag=direct",
                               "status=none") / 1e6)
    total = size * len(devices) / 1e6
    return {"blkdiscard_MBps_p50": round(pct(discard, 0.5), 1), "dd_MBps_p50": round(pct(dd, 0.5), 1),
            "blkdiscard_all_MBps": round(total / sum(size / 1e6 / r for r in discard), 1),
            "dd_all_MBps": round(total / sum(size / 1e6 / r for r in dd), 1)}


def port_move_by_hand(netns: str, moves: int = 20) -> float:
    """The baseline of a port move: what an operator types on the leaf, ``ip link set swp1 master <bridge>``, into
    a bridge of the leaf's and back, the server off; the median of ``moves`` one-way moves, in seconds."""
    subprocess.run(["ip", "-n", netns, "link", "add", "brbench", "type", "bridge"], check=True)
    try:
        times = [timed("ip", "-n", netns, "link", "set", "swp1", "master", bridge)
                 for _ in range(moves // 2) for bridge in ("brbench", "br4094")]
    finally:
        subprocess.run(["ip", "-n", netns, "link", "set", "swp1", "master", "br4094"], check=False)
        subprocess.run(["ip", "-n", netns, "link", "del", "brbench"], check=False)
    return round(pct(times, 0.5), 4)


async def until(fetch, done, timeout: float, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        value = await fetch()
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up after {timeout} s: {value}")
        await asyncio.sleep(interval)   # a benchmark's poll of the API; its resolution bounds the figures' precision


async def main(n: int, disk_mib: int, leaf: bool = True) -> dict:
    image = await asyncio.to_thread(vm.host_ready)
    underlay = Lab(0, dataplanes=False)   # the fabric the server's leaf is on
    lab = BmcLab(disks=8, disk_mib=disk_mib, fabric=(underlay.fabric, "ul") if leaf else None)
    work = str(work_dir("tessera-bench-bm-"))
    p = None
    runs = []
    try:
        await asyncio.to_thread(underlay.build)
        await asyncio.to_thread(lab.start)
        p = Platform(work, env={**E2E_ENV, **lab.network_env(),
                                "TESSERA_SAGA_STEP_TIMEOUTS": "provision_node=300,wipe_slots=300"}, durable=False)
        await p.start()
        async with p.admin() as admin:
            await admin.define_pool("bm", "pack", {"dedicated": "bm:NoSchedule"})
            node = await p.add_node(f"bm-{lab.tag}", env=lab.node_env(Path(work) / "redfish"), pool="bm",
                                    wipe_policy=POLICY)
            await admin.request("POST", "/v1/images", json_body=vm.catalog_entry(image, default=True), expect=(201,))
            await admin.request("PUT", f"/v1/nodes/{node}/bmc", json_body=lab.bmc_body())
            t = await admin.create_tenant(f"bench-{uuid.uuid4().hex[:6]}")
            await admin.set_quota(t["id"], "bm", "H100", 8 * n)   # the gateway sees released use with a lag
            user = await admin.create_user(t["id"], "bench", "tenant_user")
        async with TesseraClient(p.gateway_url, user["api_key"]) as client:
            for i in range(n):
                t0 = time.time()
                a = await client.create_allocation(f"bm-{i}", "bm.8gpu", pool="bm", tolerations=["dedicated=bm:NoSchedule"])
                a = await until(lambda a=a: client.allocation(a["id"]), lambda x: x["state"] in ("ACTIVE", "FAILED"), 600)
                if a["state"] != "ACTIVE":
                    raise RuntimeError(f"allocation {i} failed: {a.get('reason')}")
                for dev in lab.loops:
                    await asyncio.to_thread(fill_pattern, dev)
                r0 = time.time()
                await client.release(a["id"])
                done = await until(lambda a=a: client.allocation(a["id"]), lambda x: x["state"] == "RELEASED", 600)
                if leaf:   # the port's move back (network.port_moved) may be projected just after the release
                    done = await until(lambda a=a: client.allocation(a["id"]),
                                       lambda x: x["instance"].get("network_phase") == "cleaning", 30)
                wipe = (await client.request("GET", f"/v1/allocations/{a['id']}/wipe"))[1]
                devices = [d for s in wipe["slots"] for d in s["devices"]]
                runs.append({"request_to_active_s": epoch(a["updated_at"]) - t0,
                             "phases": {ph["name"]: ph["seconds"] for ph in a["instance"]["phases"]},
                             "redfish_calls": a["instance"]["redfish_calls"],
                             "release_phases": {ph["name"]: ph["seconds"] for ph in done["instance"]["phases"]
                                                if ph["name"] in RELEASE_PHASES},
                             "release_s": epoch(done["updated_at"]) - r0, "wipe_status": wipe["status"],
                             "wipe_MBps": [d["bytes"] / d["duration_s"] / 1e6 for d in devices if d["duration_s"] > 0],
                             "wipe_slot_s": max(s["duration_s"] for s in wipe["slots"]),
                             "wipe_bytes": sum(d["bytes"] for d in devices)})
                say(f"allocation {i}: active in {runs[-1]['request_to_active_s']:.2f} s, phases {runs[-1]['phases']}, "
                    f"released in {runs[-1]['release_s']:.2f} s, wipe {wipe['status']}")
        base = await asyncio.to_thread(baselines, lab.loops, disk_mib << 20)
        base["port_move_by_hand_s"] = await asyncio.to_thread(port_move_by_hand, lab.leaf.netns) if leaf else None
    finally:
        try:
            if p is not None:
                await p.stop()
        finally:
            await asyncio.to_thread(lab.stop)
            await asyncio.to_thread(underlay.destroy)
    wipe_rate = pct([r for run in runs for r in run["wipe_MBps"]], 0.5)
    # the node wipes its slots concurrently: every disk's bytes over the slowest slot's time (the step's wall time)
    all_rate = pct([run["wipe_bytes"] / 1e6 / run["wipe_slot_s"] for run in runs], 0.5)
    return {
        "benchmark": "baremetal", "allocations": n, "disk_mib": disk_mib, "disks": 8, "leaf": leaf,
        "request_to_active_s": {"p50": round(pct([r["request_to_active_s"] for r in runs], 0.5), 2),
                                "p99": round(pct([r["request_to_active_s"] for r in runs], 0.99), 2)},
        "phases_p50_s": {ph: round(pct([r["phases"].get(ph, float("nan")) for r in runs], 0.5), 3) for ph in PHASES},
        # the server's switch port: to its tenant network at hand-off, back to the provisioning one at release
        "port_moves_p50_s": {
            "to_tenant": round(pct([r["phases"].get("port_to_tenant", float("nan")) for r in runs], 0.5), 3),
            "to_provisioning": round(pct([r["release_phases"].get("port_to_provisioning", float("nan"))
                                          for r in runs], 0.5), 3)},
        # the step's move (the leaf's state read, the address probe, the commands) over the bare command by hand
        "port_to_tenant_ratio_to_hand_move": round(pct([r["phases"].get("port_to_tenant", float("nan"))
                                                        for r in runs], 0.5) / base["port_move_by_hand_s"], 1)
        if leaf else None,
        # request → ACTIVE less the driver's phases: gateway, saga, scheduler, network, volume, messages
        "control_plane_s_p50": round(pct(cp := [r["request_to_active_s"] - sum(r["phases"].values()) for r in runs], 0.5), 3),
        "control_plane_share_p50": round(pct([c / r["request_to_active_s"] for c, r in zip(cp, runs)], 0.5), 4),
        "redfish_calls_per_provision": round(pct([r["redfish_calls"] for r in runs], 0.5)),
        "release_s_p50": round(pct([r["release_s"] for r in runs], 0.5), 2),
        "wipe_slot_s_p50": round(pct([r["wipe_slot_s"] for r in runs], 0.5), 3),
        "wiped": sum(r["wipe_status"] == "wiped" for r in runs),
        "wipe_MBps_p50": round(wipe_rate, 1), **base,
        "wipe_ratio_to_blkdiscard": round(wipe_rate / base["blkdiscard_MBps_p50"], 3),
        "wipe_ratio_to_dd": round(wipe_rate / base["dd_MBps_p50"], 3),
        "wipe_all_MBps_p50": round(all_rate, 1),
        "wipe_all_ratio_to_blkdiscard": round(all_rate / base["blkdiscard_all_MBps"], 3),
        "wipe_all_ratio_to_dd": round(all_rate / base["dd_all_MBps"], 3),
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--allocations", type=int, default=5)
    ap.add_argument("--disk-mib", type=int, default=256)
    ap.add_argument("--no-leaf", action="store_true", help="the server on the provisioning bridge itself (no switch, "
                                                          "no port move): how the lab was before its leaf")
    args = ap.parse_args()
    print(json.dumps(asyncio.run(main(args.allocations, args.disk_mib, leaf=not args.no_leaf))), flush=True)
