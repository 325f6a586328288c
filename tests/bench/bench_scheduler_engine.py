"""In-process benchmark of the scheduler's placement engine — not a test.

`python -m tests.bench.bench_scheduler_engine [--nodes 1000,10000] [--ops 60000]`

100,000 nodes (800,000 GPUs) is an option, not in the default run (about 7 minutes on the 2-core build
machine, most of it building the inventory three times and the warm-up streams):
`python -m tests.bench.bench_scheduler_engine --nodes 1000,10000,100000`.

Builds an inventory of N simulated nodes (mixed pools: shared / spot / tenant-dedicated with
taints / bare-metal; mixed models: 8xH100 HGX, 8xA100 HGX, 4xL40S PCIe) and 1,000 tenants with
quotas, fills it to about 75 % and then runs a steady stream of allocate and release operations
(1/2/4/8-GPU vm slices, bare metal, MIG instances) around that utilisation. It measures:

- engine: ``Inventory.place`` + ``hold`` (an allocate decision) and ``free`` (a release), each
  timed alone: decisions/s over both, p50/p99 latency of allocate decisions and of releases;
- scheduler: the same stream through ``Scheduler.submit``/``release`` (quota checks, fair queue,
  queue re-evaluation on every release);
- memory: the Python heap one inventory with its quotas takes (tracemalloc, while building the
  scheduler's inventory: tracing is stopped before anything is timed), the process RSS after building
  the engine's inventory and how much building it grew the RSS (psutil), and the process's peak RSS;
- baseline: a trivial dict-update loop in the same process, to compare machines;
- the per-decision cost ratio between the largest and the smallest node count (``cost_ratio``, which
  ``meets_targets`` uses) and of every size to 10,000 nodes (``cost_ratio_to_10000``).
The last line is one JSON object with every figure.
"""
from __future__ import annotations

import argparse
import gc
import json
import random
import resource
import sys
import time
import tracemalloc
import uuid

import psutil

from services.node_agent.adapters.discovery.sim import sim_topology
from services.scheduler.domain.gang import Gang
from services.scheduler.domain.inventory import Inventory, NodeState, Pool, Request
from services.scheduler.domain.queue import FairQueue
from services.scheduler.domain.quota import QuotaBook, QuotaKey
from services.scheduler.domain.scheduler import Scheduler
from services.scheduler.domain.shapes import STANDARD_SHAPES
from services.scheduler.domain.topology import derive_slot_map

TENANTS = 1000
DEDICATED_TENANTS = 20
KINDS = (("hgx-h100-8", "H100", 0.70), ("hgx-a100-8", "A100", 0.22), ("pcie-l40s-4", "L40S", 0.08))
POOLS = (("shared", 0.60), ("spot", 0.20), ("dedicated", 0.10), ("bm", 0.10))
SHAPE_MIX = (("vm.1gpu", 0.32), ("vm.2gpu", 0.20), ("vm.4gpu", 0.14), ("vm.8gpu", 0.08),
             ("bm.8gpu", 0.06), ("mig.1g.10gb", 0.14), ("mig.3g.40gb", 0.06))


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))] if s else float("nan")


def choose(rng: random.Random, table):
    return rng.choices([t[0] for t in table], weights=[t[-1] for t in table])[0]


def build(n_nodes: int, seed: int):
    """Inventory, quota book and tenant list for ``n_nodes`` nodes."""
    rng = random.Random(seed)
    inv, quotas = Inventory(), QuotaBook()
    tenants = [uuid.UUID(int=rng.getrandbits(128)) for _ in range(TENANTS)]
    inv.set_pool(Pool("shared"))
    inv.set_pool(Pool("spot", "spread", {"spot": "true"}))
    inv.set_pool(Pool("bm"))
    for i in range(DEDICATED_TENANTS):
        inv.set_pool(Pool(f"dedicated-{i}", "pack", {"tenant": str(tenants[i])}))
    for i in range(n_nodes):
        kind = choose(rng, [(k, w) for k, _, w in KINDS])
        model = next(m for k, m, _ in KINDS if k == kind)
        pool = choose(rng, POOLS)
        if pool == "dedicated":
            pool = f"dedicated-{i % DEDICATED_TENANTS}"
        name = f"node-{i:05d}"
        slot_map, _ = derive_slot_map(sim_topology(name, kind))
        inv.upsert_node(NodeState(uuid.UUID(int=rng.getrandbits(128)), name, pool, model, f"region-{i % 3}",
                                  f"site-{i % 7}", f"rack-{i // 32}", {}, {}, False, slot_map, True))
    share = max(8, n_nodes * 8 // TENANTS * 4)     # quotas oversubscribe the cluster 4x, like real clouds
    for t_i, t in enumerate(tenants):
        for _, model, _ in KINDS:
            for pool in ("shared", "spot", "bm"):
                quotas.set_limit(QuotaKey(t, model, pool), share, guaranteed=share // 8)
            if t_i < DEDICATED_TENANTS:
                quotas.set_limit(QuotaKey(t, model, f"dedicated-{t_i}"), n_nodes * 8)
    return inv, quotas, tenants


def make_request(rng: random.Random, tenants: list[uuid.UUID]) -> Request:
    t_i = rng.randrange(len(tenants))
    shape = STANDARD_SHAPES[choose(rng, SHAPE_MIX)]
    model = choose(rng, [(m, w) for _, m, w in KINDS])
    if model == "L40S" and (shape.kind != "vm" or shape.gpu_count > 4):
        model = "H100"     # 4-GPU PCIe servers: no MIG, no 8-GPU slice, no 8-GPU bare metal
    spot = rng.random() < 0.2
    if shape.kind == "bare_metal":
        pool, tol = "bm", frozenset()
    elif spot:
        pool, tol = "spot", frozenset({"spot"})
    elif t_i < DEDICATED_TENANTS and rng.random() < 0.5:
        pool, tol = f"dedicated-{t_i}", frozenset({f"tenant={tenants[t_i]}"})
    else:
        pool, tol = "shared", frozenset()
    sized = type(shape)(shape.name, shape.kind, shape.gpu_count, model, shape.mig_profile)
    return Request(uuid.uuid4(), tenants[t_i], sized, priority=rng.choice((0, 0, 0, 1, 2)),
                   spot=spot, pool=pool, tolerations=tol)


def pop_random(rng: random.Random, live: list[uuid.UUID]) -> uuid.UUID:
    j = rng.randrange(len(live))
    live[j], live[-1] = live[-1], live[j]
    return live.pop()


def engine_stream(inv: Inventory, tenants, ops: int, seed: int, target: float = 0.75,
                  live: list[uuid.UUID] | None = None) -> dict:
    """Steady allocate/release stream straight on the Inventory; times every operation. ``live``:
    allocations held before (a warm-up's), released like the stream's own."""
    rng = random.Random(seed)
    total = sum(t for _, t in inv.utilisation().values())
    live = [] if live is None else live
    used = sum(len(inv.holding(a)[1].slots) for a in live if inv.holding(a)[1].mig_profile is None)
    alloc_ns, free_ns, placed, failed = [], [], 0, 0
    reqs = [make_request(rng, tenants) for _ in range(ops)]
    clock = time.perf_counter_ns
    gc.collect()
    t0 = time.perf_counter()
    for i in range(ops):
        releasing = live and (used / total > target or rng.random() < 0.3)
        if releasing:
            aid = pop_random(rng, live)
            s = clock()
            p = inv.free(aid)
            free_ns.append(clock() - s)
            used -= len(p.slots) if p.mig_profile is None else 0
            continue
        req = reqs[i]
        s = clock()
        p = inv.place(req)
        if p is not None:
            inv.hold(req.allocation_id, req, p)
        alloc_ns.append(clock() - s)
        if p is None:
            failed += 1
        else:
            placed += 1
            live.append(req.allocation_id)
            used += len(p.slots) if p.mig_profile is None else 0
    wall = time.perf_counter() - t0
    n = len(alloc_ns) + len(free_ns)
    return {"decisions": n, "decisions_per_s": round(n / wall), "allocate_decisions": len(alloc_ns),
            "placed": placed, "no_fit": failed, "releases": len(free_ns),
            "allocate_p50_us": round(pct(alloc_ns, .5) / 1e3, 1), "allocate_p99_us": round(pct(alloc_ns, .99) / 1e3, 1),
            "release_p50_us": round(pct(free_ns, .5) / 1e3, 1), "release_p99_us": round(pct(free_ns, .99) / 1e3, 1),
            "mean_us_per_decision": round(wall / n * 1e6, 2), "end_utilisation": round(used / total, 3)}


def scheduler_stream(inv: Inventory, quotas: QuotaBook, tenants, ops: int, seed: int, target=0.75,
                     warm: int = 0, gang_share: float = 0.1) -> dict:
    """The same kind of stream through Scheduler.submit/release (quota, queue, re-evaluation), a
    ``gang_share`` of the requests being gangs of 2-8 members (``submit_gang``, all or nothing); the first
    ``warm`` operations fill the inventory and are not timed."""
    rng = random.Random(seed + 1)
    sched = Scheduler(inv, quotas, FairQueue(max_per_tenant=50), aging_s=30.0, max_scan=200)
    total = sum(t for _, t in inv.utilisation().values())
    live: list[uuid.UUID] = []
    kinds: dict[str, int] = {}
    lat: list[int] = []
    gang_lat: list[int] = []
    reqs = [make_request(rng, tenants) for _ in range(ops + warm)]
    sizes = [rng.randint(2, 8) if rng.random() < gang_share else 0 for _ in range(ops + warm)]
    clock = time.perf_counter_ns
    used = 0

    def gpus(p) -> int:
        return len(p.slots) if p.mig_profile is None else 0
    for i in range(ops + warm):
        if i == warm:
            lat.clear()
            gang_lat.clear()
            kinds.clear()
            gc.collect()
            t0 = time.perf_counter()
        if live and (used / total > target or rng.random() < 0.3):
            aid = pop_random(rng, live)
            used -= gpus(inv.holding(aid)[1])
            s = clock()
            newly = sched.release(aid)
            lat.append(clock() - s)
            newly += [m for gp in sched.take_placed_gangs() for m in gp.members()]
            live.extend(r.allocation_id for r, _ in newly)
            used += sum(gpus(p) for _, p in newly)
            continue
        if sizes[i]:
            g = Gang(reqs[i], tuple(uuid.uuid4() for _ in range(sizes[i])))
            s = clock()
            d = sched.submit_gang(g)
            gang_lat.append(clock() - s)
            lat.append(gang_lat[-1])
            kinds[f"gang_{d.kind}"] = kinds.get(f"gang_{d.kind}", 0) + 1
            if d.kind == "placed":
                live.extend(g.members)
                used += sum(gpus(p) for p in d.placement.placements)
            continue
        s = clock()
        d = sched.submit(reqs[i])
        lat.append(clock() - s)
        kinds[d.kind] = kinds.get(d.kind, 0) + 1
        if d.kind == "placed":
            live.append(reqs[i].allocation_id)
            used += gpus(d.placement)
    wall = time.perf_counter() - t0
    return {"decisions": len(lat), "decisions_per_s": round(len(lat) / wall),
            "p50_us": round(pct(lat, .5) / 1e3, 1), "p99_us": round(pct(lat, .99) / 1e3, 1),
            "gang_p50_us": round(pct(gang_lat, .5) / 1e3, 1), "gang_p99_us": round(pct(gang_lat, .99) / 1e3, 1),
            "outcomes": kinds, "pending_at_end": len(sched.queue)}


def build_traced(n_nodes: int, seed: int):
    """``build`` under tracemalloc: (inventory, quotas, tenants, Python heap bytes they take). Tracing
    stops before returning, so what the caller times next runs at full speed."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        inv, quotas, tenants = build(n_nodes, seed)
        size = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    return inv, quotas, tenants, size


def dict_baseline(n: int = 2_000_000) -> float:
    d: dict[int, int] = {}
    t0 = time.perf_counter()
    for i in range(n):
        k = i & 0xFFFF
        d[k] = d.get(k, 0) + 1
    return n / (time.perf_counter() - t0)


def run_size(n_nodes: int, ops: int, seed: int) -> dict:
    started = time.perf_counter()
    gc.collect()
    rss0 = psutil.Process().memory_info().rss
    t0 = time.perf_counter()
    inv, _, tenants = build(n_nodes, seed)
    build_s = time.perf_counter() - t0
    rss = psutil.Process().memory_info().rss
    live: list[uuid.UUID] = []
    engine_stream(inv, tenants, n_nodes * 8, seed + 7, live=live)     # warm up to steady state
    out = {"nodes": n_nodes, "gpus": sum(t for _, t in inv.utilisation().values()), "build_s": round(build_s, 2),
           "process_rss_mb": round(rss / 2**20, 1),
           # freed memory of a smaller size run before may be reused: a lower bound of what the build takes
           "build_rss_growth_mb": round((rss - rss0) / 2**20, 1),
           "engine": engine_stream(inv, tenants, ops, seed, live=live)}
    out["fragmentation"] = {f"{p}/{m}": round(v, 3) for (p, m), v in sorted(inv.fragmentation().items())
                            if not p.startswith("dedicated-")}
    del inv, tenants, live
    inv2, quotas2, tenants2, heap = build_traced(n_nodes, seed)
    out["scheduler"] = scheduler_stream(inv2, quotas2, tenants2, ops, seed, warm=n_nodes * 8)
    out["heap_mb"] = round(heap / 2**20, 1)
    out["wall_s"] = round(time.perf_counter() - started, 1)
    return out


def node_counts(values: list[str]) -> list[int]:
    """``--nodes 1000 10000`` or ``--nodes 1000,10000,100000``."""
    return sorted({int(v.replace("_", "")) for arg in values for v in arg.split(",") if v.strip()})


def ratios(sizes: dict[int, dict], to: int) -> dict[str, dict[str, float]]:
    """Per-decision cost (mean), allocate and release p50 and allocate p99 of every size over those at ``to`` nodes."""
    ref = sizes[to]["engine"]
    keys = {"per_decision": "mean_us_per_decision", "allocate_p50": "allocate_p50_us",
            "release_p50": "release_p50_us", "allocate_p99": "allocate_p99_us"}
    return {str(n): {name: round(r["engine"][k] / ref[k], 2) for name, k in keys.items()}
            for n, r in sizes.items() if n != to}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", nargs="+", default=["1000,10000"],
                    help="node counts, comma- or space-separated (100,000: --nodes 1000,10000,100000)")
    ap.add_argument("--ops", type=int, default=60_000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--rack-count", action="store_true", help="only: CPU time of one gang's rack count and fill")
    args = ap.parse_args(argv)
    if args.rack_count:
        return rack_count(args.seed)
    started = time.perf_counter()
    baseline = dict_baseline()
    sizes = {}
    for n in node_counts(args.nodes):
        r = sizes[n] = run_size(n, args.ops, args.seed)
        e, s = r["engine"], r["scheduler"]
        print(f"{n:>6} nodes ({r['gpus']} GPUs): engine {e['decisions_per_s']:,} decisions/s, allocate "
              f"p50 {e['allocate_p50_us']} us p99 {e['allocate_p99_us']} us, release p99 {e['release_p99_us']} us; "
              f"scheduler {s['decisions_per_s']:,}/s p99 {s['p99_us']} us; process rss {r['process_rss_mb']} MB, "
              f"heap {r['heap_mb']} MB; {r['wall_s']} s", file=sys.stderr)
    lo, hi = min(sizes), max(sizes)
    ratio = sizes[hi]["engine"]["mean_us_per_decision"] / sizes[lo]["engine"]["mean_us_per_decision"]
    top = sizes[hi]["engine"]
    result = {
        "bench": "scheduler_engine", "python": sys.version.split()[0],
        "baseline_dict_updates_per_s": round(baseline),
        "sizes": {str(n): r for n, r in sizes.items()},
        "cost_ratio": {"from_nodes": lo, "to_nodes": hi, "per_decision": round(ratio, 2),
                       # medians resist the noise of a shared machine better than means
                       "allocate_p50": round(top["allocate_p50_us"] / sizes[lo]["engine"]["allocate_p50_us"], 2),
                       "release_p50": round(top["release_p50_us"] / sizes[lo]["engine"]["release_p50_us"], 2)},
        "cost_ratio_to_10000": ratios(sizes, 10000) if 10000 in sizes else None,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "targets": {"decisions_per_s": 5000, "p99_ms": 5.0, "cost_ratio_max": 2.0},
        "meets_targets": top["decisions_per_s"] >= 5000 and top["allocate_p99_us"] <= 5000
        and top["release_p99_us"] <= 5000 and ratio <= 2.0,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    print(f"cost per decision at {hi} vs {lo} nodes: {ratio:.2f}x; to 10000 nodes: {result['cost_ratio_to_10000']}; "
          f"dict-update baseline {baseline:,.0f}/s; {result['wall_s']} s", file=sys.stderr)
    print(json.dumps(result))
    return result


def rack_count(seed: int, calls: int = 200) -> dict:
    """CPU time of ``gang._by_rack`` (the racks' room counted, the chosen racks filled, nothing kept) at 10,000
    nodes of 8 GPUs, 32 per rack, half of them in the measured (pool, model), with ~60 % of its GPUs held."""
    from services.scheduler.domain import gang
    rng, inv = random.Random(seed), Inventory()
    slot_map = derive_slot_map(sim_topology("bench", "hgx-h100-8"))[0]
    for i in range(10_000):
        inv.upsert_node(NodeState(uuid.UUID(int=i + 1), f"n{i}", ("shared", "spot")[i % 2], "H100", "r", "s",
                                  f"rack-{i // 32}", {}, {}, False, slot_map, True))
    tenant = uuid.uuid4()
    for _ in range(9_000):
        r = Request(uuid.uuid4(), tenant, STANDARD_SHAPES[rng.choice(["vm.1gpu", "vm.2gpu", "vm.4gpu"])], pool="shared")
        p = inv.place(r)
        if p is not None:
            inv.hold(r.allocation_id, r, p)
    out = {}
    for shape, n in (("vm.1gpu", 8), ("vm.2gpu", 6), ("vm.4gpu", 4), ("vm.8gpu", 4), ("bm.8gpu", 3)):
        reqs = [Request(uuid.uuid4(), tenant, STANDARD_SHAPES[shape], pool="shared") for _ in range(n)]
        t0 = time.process_time()
        for _ in range(calls):
            gang._by_rack(inv, reqs, ("shared", "H100"), False)
        out[f"{shape}x{n}"] = round(1000 * (time.process_time() - t0) / calls, 3)
    print(f"gang rack count and fill, CPU ms per call at 10,000 nodes: {out}", file=sys.stderr)
    print(json.dumps({"bench": "scheduler_rack_count", "cpu_ms_per_call": out}))
    return out


if __name__ == "__main__":
    main()
