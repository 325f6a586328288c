"""`./taskw bench:vm` — not a test. VM slices end to end: N allocations (default 10) of `vm.1gpu` at concurrency C
(default 2) through the gateway, the saga and two node-agents running the libvirt driver on the local libvirtd
(QEMU, TCG, no passthrough), each node in its own lab network namespace (the real kernel dataplane), guests booting
the project's image. Needs root.

Per allocation: t0 is taken just before POST /v1/allocations; *ready* is the allocation ACTIVE — the node-agent
answers only once the guest printed its ready line, so ACTIVE is guest ready. The allocation is read (GET) after
each event of its server-sent event stream — not polled, which would load the gateway on the machine the guests boot
on — and the time used is its ``updated_at`` at ACTIVE (the gateway's projection stamps it with PostgreSQL's
``now()`` when it applies ``allocation.activated``: the moment a tenant could first see ACTIVE), not when the client
saw it (reported beside it, ``..._seen_by_client``). The split: driver = the instance's ``prepare_s`` (image check, overlay, seed)
and ``start_s`` (define + start); guest boot = ``boot_s`` (start → ready line, as the driver saw it, polling the
console every 0.1 s); control plane = the rest (saga, messages, placement, network, the node's plumbing), itself
split at the driver: before it (t0 → driver begins, ``booted_at − boot_s − start_s − prepare_s``) and after the
guest was ready (``booted_at`` → ACTIVE). The figures come from the allocation's ``instance`` and, for any the API
lacks, from the instance's ``instance.json`` in the node's state directory (``split_source`` says which). Each
allocation is then released and counts as done at RELEASED (timed too), so at most C guests run at once.

Baselines in the same run, with no allocation running: the domain XML the driver started (``domain.xml`` of the
first allocation, read before its release) with its own name, UUID, tap, fresh overlay on the same base, a copy of
the seed and its own console, started by ``virsh create`` — at concurrency C (as loaded as the measured run) and
at concurrency 1 — timed from the create call to the READY line on its console (polled every 20 ms), and the
create call itself; create returned → READY is the guest's own boot time. Each is destroyed after.
The last line is one JSON object with every figure.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import time
import uuid
import xml.etree.ElementTree as ET
from datetime import datetime
from pathlib import Path

from services.node_agent.adapters.dataplane.lab import UNDERLAY_DEV, Lab, is_root
from services.node_agent.domain.vm.cloudinit import parse_failed_line, parse_ready_line
from services.node_agent.domain.vm.domain_xml import domain_name
from tests.bench.bench_saga import cpu_seconds
from tests.bench.common import log_problems, pct, work_dir
from tests.support import vm
from tests.support.platform import E2E_ENV
from tooling.client import TesseraClient
from tooling.platform import Platform

BOOT_S = 300          # the provision_node step's timeout (a guest's boot under TCG on a busy machine)
SPLIT = ("prepare_s", "start_s", "boot_s", "booted_at")


def say(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


def epoch(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


async def until_state(client: TesseraClient, events, allocation_id: str, state: str, timeout: float,
                      envelopes: dict) -> tuple[dict, float]:
    """Read the allocation (GET) at first and after each of its events (its server-sent event stream ``events``,
    whose envelopes go into ``envelopes`` by type) until it is in ``state``: (the allocation, when that GET answered)."""
    async def wait() -> tuple[dict, float]:
        while True:
            a = await client.allocation(allocation_id)
            if a["state"] == state:
                return a, time.time()
            if a["state"] == "FAILED":
                raise RuntimeError(f"allocation {allocation_id} FAILED at {a.get('failed_step')}: {a.get('reason')}")
            env = await anext(events)
            envelopes.setdefault(env.get("type"), env)
    try:
        return await asyncio.wait_for(wait(), timeout)
    except TimeoutError:
        raise TimeoutError(f"allocation {allocation_id} not {state} after {timeout}s") from None


# -- the baseline: the started domain XML, by hand --------------------------------------------------------
def keep_source(state: Path, into: Path) -> dict:
    """What a baseline domain needs of an instance (copied before its release): its XML, seed and overlay base."""
    into.mkdir(parents=True, exist_ok=True)
    shutil.copy(state / "domain.xml", into / "domain.xml")
    shutil.copy(state / "seed.iso", into / "seed.iso")
    info = json.loads(subprocess.run(["qemu-img", "info", "-U", "--output=json", str(state / "overlay.qcow2")],
                                     capture_output=True, text=True, check=True).stdout)
    return {"xml": (into / "domain.xml").read_text(), "seed": into / "seed.iso", "size": info["virtual-size"],
            "base": info.get("full-backing-filename") or info["backing-filename"],
            "base_format": info.get("backing-filename-format", "qcow2")}


def baseline_xml(xml: str, name: str, files: Path, tap: str) -> str:
    """The driver's XML with its own name, UUID, files and tap, and without Tessera's metadata (no node-agent
    takes it for its own)."""
    root = ET.fromstring(xml)
    root.find("name").text = name
    root.find("uuid").text = str(uuid.uuid4())
    for meta in root.findall("metadata"):
        root.remove(meta)
    devices = root.find("devices")
    for disk in devices.findall("disk"):
        disk.find("source").set("file", str(files / ("seed.iso" if disk.get("device") == "cdrom" else "overlay.qcow2")))
    for nic in devices.findall("interface"):
        nic.find("target").set("dev", tap)
    for tag in ("serial", "console"):
        for dev in devices.findall(tag):
            dev.find("source").set("path", str(files / ("console.sock" if dev.get("type") == "unix" else "console.log")))
    return ET.tostring(root, encoding="unicode")


def virsh(*args: str, timeout: float = 120) -> None:
    done = subprocess.run(["virsh", "-q", "-c", vm.URI, *args], capture_output=True, text=True, timeout=timeout)
    if done.returncode:
        raise RuntimeError(f"virsh {' '.join(args)}: {done.stderr.strip()}")


def until_ready_line(console: Path, timeout: float) -> float:
    """When the READY line appeared on the console (polled every 20 ms); raises with the console's tail."""
    deadline, seen = time.monotonic() + timeout, 0
    while time.monotonic() < deadline:
        data = console.read_bytes() if console.exists() else b""
        complete = data[seen:data.rfind(b"\n") + 1] if len(data) > seen else b""
        seen += len(complete)
        for line in complete.decode(errors="replace").splitlines():
            if parse_ready_line(line) is not None:
                return time.time()
            if parse_failed_line(line) is not None:
                raise RuntimeError(f"baseline guest failed: {line}")
        time.sleep(0.02)
    tail = console.read_bytes()[-2000:].decode(errors="replace") if console.exists() else "(no console)"
    raise TimeoutError(f"baseline guest not ready after {timeout}s; console:\n{tail}")


def virsh_boot(src: dict, files: Path, name: str, tap: str) -> dict:
    """One baseline: prepare (overlay, seed copy, XML), ``virsh create``, READY, ``virsh destroy``; seconds."""
    p0 = time.time()
    files.mkdir(parents=True)
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", src["base_format"], "-b", src["base"],
                    str(files / "overlay.qcow2"), str(src["size"])], capture_output=True, text=True, check=True)
    shutil.copy(src["seed"], files / "seed.iso")
    (files / "domain.xml").write_text(baseline_xml(src["xml"], name, files, tap))
    t0 = time.time()
    try:
        virsh("create", str(files / "domain.xml"))
        t1 = time.time()
        ready = until_ready_line(files / "console.log", BOOT_S)
    finally:
        d0 = time.time()
        subprocess.run(["virsh", "-q", "-c", vm.URI, "destroy", name], capture_output=True, timeout=120)
        d1 = time.time()
    return {"prepare_s": t0 - p0, "create_s": t1 - t0, "create_to_ready_s": ready - t0, "boot_s": ready - t1,
            "destroy_s": d1 - d0}


async def baselines(src: dict, where: Path, n: int, concurrency: int, tag: str) -> list[dict]:
    queue, out, run = list(range(n)), [], uuid.uuid4().hex[:6]

    async def worker():
        while queue:
            i = queue.pop(0)
            name = f"tvb-{run}-{tag}{i}"
            out.append(await asyncio.to_thread(virsh_boot, src, where / f"{tag}{i}", name, f"tvb{tag}{i}{uuid.uuid4().hex[:6]}"))
            say(f"baseline {tag}{i}: create→ready {out[-1]['create_to_ready_s']:.2f}s")
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return out


# -- the platform -----------------------------------------------------------------------------------------
async def one(p: Platform, client: TesseraClient, i: int, keep: dict) -> dict:
    """One allocation: POST → ACTIVE → (its instance's figures) → release → RELEASED."""
    t0 = time.time()
    a = await client.create_allocation(f"bench-vm-{i}", "vm.1gpu", **p.opts)
    events = client.events(a["id"])
    try:
        return await follow(p, client, events, a["id"], i, t0, keep)
    finally:
        await events.aclose()


async def follow(p: Platform, client: TesseraClient, events, allocation_id: str, i: int, t0: float, keep: dict) -> dict:
    envelopes: dict[str, dict] = {}
    active, seen = await until_state(client, events, allocation_id, "ACTIVE", BOOT_S + 60, envelopes)
    inst = active.get("instance") or {}
    state = p.state_dirs[active["node_id"]] / domain_name(allocation_id)
    on_disk = json.loads((state / "instance.json").read_text())
    on_disk["booted_at"] = datetime.fromtimestamp(on_disk["ready_at"]).astimezone().isoformat()
    on_disk["boot_s"] = round(on_disk["ready_at"] - on_disk["started_at"], 3)
    split = {k: inst[k] if inst.get(k) is not None else on_disk[k] for k in SPLIT}
    source = "api" if all(inst.get(k) is not None for k in SPLIT) else \
        "instance.json (the API lacks " + ", ".join(k for k in SPLIT if inst.get(k) is None) + ")"
    if "src" not in keep:
        keep["src"] = None
        keep["src"] = await asyncio.to_thread(keep_source, state, keep["dir"])
    r0 = time.time()
    await client.release(allocation_id)
    released, rseen = await until_state(client, events, allocation_id, "RELEASED", 120, envelopes)
    active_at, booted = epoch(active["updated_at"]), epoch(split["booted_at"])
    total = active_at - t0
    driver_begin = booted - split["boot_s"] - split["start_s"] - split["prepare_s"]
    r = {"i": i, "id": allocation_id, "node": active["node_id"][:8], "request_to_ready_s": total,
         "request_to_ready_seen_s": seen - t0,
         "control_plane_s": total - split["prepare_s"] - split["start_s"] - split["boot_s"],
         "cp_before_driver_s": driver_begin - t0, "cp_after_ready_s": active_at - booted,
         "prepare_s": split["prepare_s"], "start_s": split["start_s"], "boot_s": split["boot_s"],
         "release_s": epoch(released["updated_at"]) - r0, "release_seen_s": rseen - r0, "split_source": source}
    r["control_plane_share"] = r["control_plane_s"] / total
    activated = envelopes.get("allocation.activated")   # the allocation service's event, its own clock reading
    r["ready_to_activated_s"] = epoch(activated["occurred_at"]) - booted if activated else None
    r["activated_to_gateway_s"] = active_at - epoch(activated["occurred_at"]) if activated else None
    say(f"allocation {i}: request→ready {total:.2f}s (control plane {r['control_plane_s']:.2f}s, boot {r['boot_s']:.2f}s)")
    return r


async def drive(p: Platform, client: TesseraClient, n: int, concurrency: int, keep: dict,
                first: int = 0) -> tuple[list[dict], float]:
    queue, out = list(range(first, first + n)), []

    async def worker():
        while queue:
            out.append(await one(p, client, queue.pop(0), keep))
    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return sorted(out, key=lambda r: r["i"]), time.perf_counter() - t0


def new_platform(work: Path, nodes: int) -> Platform:
    """A durable platform of its own (its provision_node step may take a VM's boot) and a lab of ``nodes``."""
    p = Platform(work, env={**E2E_ENV, "TESSERA_SAGA_STEP_TIMEOUTS": f"provision_node={BOOT_S}"}, durable=True)
    p.lab, p.state_dirs = Lab(nodes, dataplanes=False), {}
    return p


async def start_platform(p: Platform, work: Path, image) -> None:
    """Start it, build the lab, one libvirt node-agent per lab node in a spread pool, the image as the default,
    a tenant with quota on the pool."""
    await p.start()
    await asyncio.to_thread(p.lab.build)
    async with p.admin() as admin:
        await admin.define_pool("vm", "spread", {"dedicated": "vm:NoSchedule"})
        p.lab.node_ids = []   # the nodes' own ids: destroy removes what their dataplanes made
        for i, ns in enumerate(p.lab.node_ns):
            state = work / f"node{i}"
            node_env = {**vm.VM_ENV, "TESSERA_NODE_DATAPLANE": "kernel", "TESSERA_NODE_NETNS": ns,
                        "TESSERA_NODE_UNDERLAY_DEV": UNDERLAY_DEV, "TESSERA_LIBVIRT_STATE_DIR": str(state),
                        "TESSERA_NODE_RECONCILE_S": "2"}
            node = await p.add_node(f"bench-vm-{uuid.uuid4().hex[:6]}-{i}", env=node_env, pool="vm")
            p.state_dirs[node] = state
            p.lab.node_ids.append(uuid.UUID(node))
        status, body, _ = await admin.request("POST", "/v1/images", json_body=vm.catalog_entry(image, default=True))
        assert status == 201, body
        t = await admin.create_tenant(f"bench-vm-{uuid.uuid4().hex[:6]}")
        await admin.set_quota(t["id"], "vm", "H100", 8)
        p.api_key = (await admin.create_user(t["id"], "bench", "tenant_user"))["api_key"]
    p.opts = {"pool": "vm", "tolerations": ["dedicated=vm:NoSchedule"]}


def remove_domains(work: Path, node_ids) -> list[str]:
    """Every domain of this run (its nodes' and the baselines'): destroyed and undefined; their names."""
    gone = []
    for name in vm.domains():
        xml = subprocess.run(["virsh", "-c", vm.URI, "dumpxml", name], capture_output=True, text=True).stdout
        if str(work) in xml or any(str(n) in xml for n in node_ids):
            subprocess.run(["virsh", "-c", vm.URI, "destroy", name], capture_output=True)
            subprocess.run(["virsh", "-c", vm.URI, "undefine", name], capture_output=True)
            gone.append(name)
    return gone


# -- the run ----------------------------------------------------------------------------------------------
async def main(n: int, concurrency: int, nodes: int, warmup: int, n_base: int, n_base1: int) -> tuple[list[dict], dict]:
    image = await asyncio.to_thread(vm.host_ready)
    work = work_dir("tessera-bench-")
    say(f"work dir (service logs: logs/): {work}")
    keep = {"dir": work / "baseline" / "source"}
    p = new_platform(work, nodes)
    try:
        await start_platform(p, work, image)
        async with TesseraClient(p.gateway_url, p.api_key) as client:
            await client.token()
            warm, _ = await drive(p, client, warmup, concurrency, keep, first=-warmup) if warmup else ([], 0.0)
            cpu0 = cpu_seconds(p)
            runs, wall = await drive(p, client, n, concurrency, keep)
            cpu1 = cpu_seconds(p)
        at_c = await baselines(keep["src"], work / "baseline", n_base, concurrency, "c")
        at_1 = await baselines(keep["src"], work / "baseline", n_base1, 1, "s")
        logs = log_problems(list((work / "logs").glob("*.log")))
    finally:
        try:
            await p.stop()
        finally:
            gone = await asyncio.to_thread(remove_domains, work, list(p.state_dirs))
            if gone:
                say(f"removed domains left behind: {gone}")
            await asyncio.to_thread(p.lab.destroy)
            shutil.rmtree(work / "baseline", ignore_errors=True)
    return runs, figures(runs, warm, wall, cpu0, cpu1, at_c, at_1, n, concurrency, nodes, logs)


def figures(runs, warm, wall, cpu0, cpu1, at_c, at_1, n, concurrency, nodes, logs) -> dict:
    def col(rows, k):
        return [r[k] for r in rows]

    def p50(rows, k):
        return round(pct(col(rows, k), 0.5), 3) if rows else None

    def p99(rows, k):
        return round(pct(col(rows, k), 0.99), 3) if rows else None
    total, cp = col(runs, "request_to_ready_s"), col(runs, "control_plane_s")
    split_rows = [r for r in runs if r["ready_to_activated_s"] is not None]
    virsh_ready = p50(at_c, "create_to_ready_s")
    result = {
        "benchmark": "vm", "n": n, "concurrency": concurrency, "nodes": nodes, "wall_s": round(wall, 1),
        "allocations_per_min": round(60 * n / wall, 2),
        "request_to_ready_p50_s": p50(runs, "request_to_ready_s"), "request_to_ready_p99_s": p99(runs, "request_to_ready_s"),
        "request_to_ready_mean_s": round(statistics.fmean(total), 3),
        "request_to_ready_seen_by_client_p50_s": p50(runs, "request_to_ready_seen_s"),
        "control_plane_p50_s": p50(runs, "control_plane_s"), "control_plane_p99_s": p99(runs, "control_plane_s"),
        "control_plane_share_p50": round(pct(col(runs, "control_plane_share"), 0.5), 4),
        "control_plane_share_of_sums": round(sum(cp) / sum(total), 4),
        "control_plane_before_driver_p50_s": p50(runs, "cp_before_driver_s"),
        "control_plane_after_ready_p50_s": p50(runs, "cp_after_ready_s"),
        "control_plane_after_ready_max_s": round(max(col(runs, "cp_after_ready_s")), 3),
        "after_ready_to_allocation_activated_p50_s": p50(split_rows, "ready_to_activated_s"),
        "after_ready_activated_to_gateway_p50_s": p50(split_rows, "activated_to_gateway_s"),
        "driver_prepare_p50_s": p50(runs, "prepare_s"), "driver_prepare_p99_s": p99(runs, "prepare_s"),
        "driver_start_p50_s": p50(runs, "start_s"), "driver_start_p99_s": p99(runs, "start_s"),
        "guest_boot_p50_s": p50(runs, "boot_s"), "guest_boot_p99_s": p99(runs, "boot_s"),
        "release_p50_s": p50(runs, "release_s"), "release_p99_s": p99(runs, "release_s"),
        "release_seen_by_client_p50_s": p50(runs, "release_seen_s"),
        "split_source": sorted({r["split_source"] for r in runs}),
        "allocations_per_node": {k: col(runs, "node").count(k) for k in sorted(set(col(runs, "node")))},
        "warmup_request_to_ready_s": [round(r["request_to_ready_s"], 3) for r in warm],
        "warmup_driver_prepare_s": [r["prepare_s"] for r in warm],
        "baseline_runs": len(at_c), "baseline_concurrency": concurrency,
        "virsh_create_p50_s": p50(at_c, "create_s"), "virsh_create_to_ready_p50_s": virsh_ready,
        "virsh_create_to_ready_max_s": round(max(col(at_c, "create_to_ready_s")), 3) if at_c else None,
        "guest_own_boot_p50_s": p50(at_c, "boot_s"), "virsh_destroy_p50_s": p50(at_c, "destroy_s"),
        "baseline_prepare_p50_s": p50(at_c, "prepare_s"),
        "baseline_c1_runs": len(at_1), "virsh_create_c1_p50_s": p50(at_1, "create_s"),
        "virsh_create_to_ready_c1_p50_s": p50(at_1, "create_to_ready_s"), "guest_own_boot_c1_p50_s": p50(at_1, "boot_s"),
        "ratio_request_to_ready_vs_virsh_to_ready": round(pct(total, 0.5) / virsh_ready, 3) if virsh_ready else None,
        "cpu_s_per_allocation": {k: round((cpu1.get(k, 0) - cpu0.get(k, 0)) / n, 3) for k in sorted(cpu1)},
        "service_log_problems": {f: {e: c for e, c in ev.items() if not e.lower().startswith(("info:", "debug:"))}
                                 for f, ev in logs.items()},
    }
    result["cpu_s_per_allocation_control_plane_total"] = round(sum(result["cpu_s_per_allocation"].values()), 3)
    result["service_log_problems"] = {f: ev for f, ev in result["service_log_problems"].items() if ev}
    result["targets"] = {"control_plane_share_le_0.10": result["control_plane_share_p50"] <= 0.10,
                         "p50_le_10s": result["request_to_ready_p50_s"] <= 10}
    return result


def table(runs: list[dict]) -> None:
    cols = ("i", "node", "request_to_ready_s", "cp_before_driver_s", "prepare_s", "start_s", "boot_s",
            "cp_after_ready_s", "ready_to_activated_s", "control_plane_s", "control_plane_share", "release_s")
    heads = ("#", "node", "req→ready", "cp:before", "prepare", "start", "boot", "cp:after", "(→alloc)", "cp", "cp share",
             "release")
    print(" ".join(f"{h:>10s}" for h in heads))
    for r in runs:
        print(" ".join(f"{r[c]:>10.3f}" if isinstance(r[c], float) else f"{str(r[c]):>10}" for c in cols))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=10, help="measured VM allocations")
    ap.add_argument("-c", "--concurrency", type=int, default=2)
    ap.add_argument("--nodes", type=int, default=2, help="libvirt nodes in the lab (at least the concurrency)")
    ap.add_argument("--warmup", type=int, default=2, help="allocations before the measured ones (first image copy on each node)")
    ap.add_argument("--baseline", type=int, default=4, help="virsh create runs at the measured concurrency")
    ap.add_argument("--baseline-c1", type=int, default=3, help="virsh create runs one at a time")
    args = ap.parse_args()
    if not is_root():
        sys.exit("bench_vm: needs root (libvirtd, QEMU, network namespaces)")
    t0 = time.perf_counter()
    runs, result = asyncio.run(main(args.n, args.concurrency, max(args.nodes, args.concurrency), args.warmup,
                                    args.baseline, args.baseline_c1))
    result["bench_wall_s"] = round(time.perf_counter() - t0, 1)
    table(runs)
    for k, v in result.items():
        print(f"{k:45s} {v}")
    print(json.dumps(result))
