"""A synthetic day of spot capacity — not a test.

`python -m tests.bench.bench_spot [--notice 30] [--headroom 4] [--seed 7]`

A 200-GPU fleet (25 nodes of 8 H100) over 24 simulated hours, one-second resolution. Tenants' demand follows the
day: 2 GPUs free at 14:00, all 200 at 02:00, plus bursts of queued jobs (8–24 GPUs for 30–90 minutes, arriving
at any second) outside 01:30–02:30. Two tenants hold guaranteed quotas (16 and 8 GPUs) whose unused part spot
must never take. A simulated scheduler places tenant GPUs at once when free capacity exists (packing onto used
nodes, releasing from the least used, so whole nodes come free), else queues them. The spot controller
(``services.paas.domain.spot.decide``) is stepped every 15 s of simulated time and its decisions go through the
recording NVCF driver; a reclaimed node's GPUs come back after the notice plus a drain time drawn in 2–12 s (a
simulation: no real drain is timed here).

Figures: the share of idle GPU-hours offered as spot; the ideal share in the same run (idle GPU-hours minus the
reserve: headroom, unused guarantees, queued demand) and the ratio of the two (target ≥ 0.8); the time from a
tenant's demand that had to wait to its capacity returning (target: max ≤ notice + 30 s); spot GPU-hours metered.
The last line is one JSON object with every figure.
"""
from __future__ import annotations

import argparse
import asyncio
import math
import random
import tempfile
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from services.paas.adapters.spot.nvcf import RecordingNvcfProvider
from services.paas.domain.spot import (
    RELEASE_BOUND_S,
    FleetSnapshot,
    NodeCapacity,
    SpotSample,
    SpotSettings,
    TenantClaim,
    aggregate,
    decide,
    meter,
)
from tests.bench.common import pct, report

DAY_S = 86400
STEP_S = 15
NODES, GPUS_PER_NODE = 25, 8
GUARANTEED = {"a": (16, 0.20), "b": (8, 0.10)}    # tenant: (guaranteed quota, share of the demand it runs)
SHARE_TARGET = 0.8


def base_demand(t: float) -> int:
    """0 GPUs at 02:00, 198 at 14:00 (2 free of 200), a cosine in between."""
    return round(99 * (1 - math.cos(2 * math.pi * (t - 2 * 3600) / DAY_S)))


def bursts(rng: random.Random) -> list[tuple[int, int, int]]:
    """(start s, end s, GPUs) of queued-job bursts, about one every 40 minutes, none around 02:00."""
    out, t = [], 0.0
    while t < DAY_S:
        t += rng.expovariate(1 / 2400)
        start, end = int(t), int(t) + rng.randint(1800, 5400)
        if end < 5400 or start > 9000:           # clear of 01:30-02:30, so all 200 GPUs are free at 02:00
            out.append((start, end, rng.choice((8, 16, 24))))
    return out


@dataclass
class Node:
    node_id: str
    tenant: int = 0
    spot: int = 0
    offered_at: float | None = None
    released_at: float | None = None          # a reclaim under way: its spot GPUs are free again then

    @property
    def free(self) -> int:
        return GPUS_PER_NODE - self.tenant - self.spot


class Day:
    def __init__(self, settings: SpotSettings, seed: int) -> None:
        self.settings = settings
        self.rng = random.Random(seed)
        self.nodes = [Node(f"gpu-{i:02d}") for i in range(NODES)]
        self.bursts = bursts(self.rng)
        self.waiting: deque[list[int]] = deque()      # [GPUs, since] of demand the fleet could not place yet
        self.waits: list[float] = []
        self.figures = dict.fromkeys(("idle", "offered", "ideal", "offers", "reclaims"), 0.0)
        self.samples: list[SpotSample] = []

    def demand(self, t: int) -> int:
        extra = sum(g for s, e, g in self.bursts if s <= t < e)
        return min(NODES * GPUS_PER_NODE - 2, base_demand(t) + extra)

    def placed(self) -> int:
        return sum(n.tenant for n in self.nodes)

    def schedule(self, t: int, want: int) -> None:
        """Tenants release or ask; what cannot be placed waits, first come first placed."""
        have = self.placed() + sum(w[0] for w in self.waiting)
        if want < have:
            self._release(have - want)
        elif want > have:
            self.waiting.append([want - have, t])
        while self.waiting:
            gpus, since = self.waiting[0]
            got = self._place(gpus)
            self.waiting[0][0] -= got
            if self.waiting[0][0]:
                break
            self.waiting.popleft()
            if t > since:
                self.waits.append(t - since)

    def _place(self, gpus: int) -> int:
        got = 0
        for n in sorted(self.nodes, key=lambda n: (-n.tenant, n.node_id)):   # pack onto used nodes
            take = min(n.free, gpus - got) if n.spot == 0 else 0
            n.tenant += take
            got += take
        return got

    def _release(self, gpus: int) -> None:
        while gpus and self.waiting:                   # queued demand goes first: it holds nothing
            drop = min(gpus, self.waiting[-1][0])
            self.waiting[-1][0] -= drop
            gpus -= drop
            if not self.waiting[-1][0]:
                self.waiting.pop()
        for n in sorted(self.nodes, key=lambda n: (n.tenant == 0, n.tenant, n.node_id)):   # least used first
            drop = min(n.tenant, gpus)
            n.tenant -= drop
            gpus -= drop

    def snapshot(self, t: int) -> FleetSnapshot:
        placed = self.placed()
        tenants = [TenantClaim(name, "gpu", guaranteed_unused=quota - min(quota, round(share * placed)))
                   for name, (quota, share) in GUARANTEED.items()]
        tenants.append(TenantClaim("queue", "gpu", pending=sum(w[0] for w in self.waiting)))
        nodes = tuple(NodeCapacity(n.node_id, "gpu", "H100", GPUS_PER_NODE, n.free, n.spot, n.offered_at,
                                   n.released_at is not None) for n in self.nodes)
        return FleetSnapshot(float(t), nodes, tuple(tenants))

    async def step(self, t: int, provider: RecordingNvcfProvider) -> None:
        snap = self.snapshot(t)
        reserve = sum(c.guaranteed_unused + c.pending for c in snap.tenants) + self.settings.headroom_gpus
        decision = decide(snap, self.settings)
        by_id = {n.node_id: n for n in self.nodes}
        for offer in decision.offers:
            node = by_id[offer.node_id]
            node.spot, node.offered_at = offer.gpus, float(t)
            await provider.offer_nodes((offer.node_id,), offer.gpu_model, offer.gpus, offer.until)
        if decision.reclaims:
            for r in decision.reclaims:
                by_id[r.node_id].released_at = t + r.notice_s + self.rng.uniform(2, 12)
            await provider.reclaim_nodes(tuple(r.node_id for r in decision.reclaims), self.settings.notice_s,
                                         "cordon_and_drain")
        idle = sum(GPUS_PER_NODE - n.tenant for n in self.nodes)
        offered = sum(n.spot for n in self.nodes if n.released_at is None)
        self.figures["idle"] += idle * STEP_S
        self.figures["offered"] += offered * STEP_S
        self.figures["ideal"] += max(0, idle - reserve) * STEP_S
        self.figures["offers"] += len(decision.offers)
        self.figures["reclaims"] += len(decision.reclaims)
        self.samples += [SpotSample(float(t), n.node_id, "H100", n.spot if n.released_at is None else 0,
                                    round(0.7 * n.spot)) for n in self.nodes]

    def returns(self, t: int, provider: RecordingNvcfProvider) -> None:
        done = [n for n in self.nodes if n.released_at is not None and n.released_at <= t]
        for n in done:
            n.spot, n.offered_at, n.released_at = 0, None, None
        if done:
            provider.released(tuple(n.node_id for n in done))


async def run_day(settings: SpotSettings, seed: int, record: Path) -> dict:
    day = Day(settings, seed)
    provider = RecordingNvcfProvider(record, clock=lambda: 0.0)
    await provider.register_cluster("tessera-spot-1", "tessera-spot", "lab", "TESSERA", ("nca-tessera",), ())
    free_at = {}
    for t in range(DAY_S):
        day.returns(t, provider)
        day.schedule(t, day.demand(t))
        if t in (2 * 3600, 14 * 3600):
            free_at[f"tenant_free_gpus_at_{t // 3600:02d}h"] = NODES * GPUS_PER_NODE - day.placed()
        if t % STEP_S == 0:
            await day.step(t, provider)
    f = day.figures
    lines = aggregate(meter(day.samples, until=DAY_S), 0, DAY_S)
    share, ideal_share = f["offered"] / f["idle"], f["ideal"] / f["idle"]
    bound = settings.notice_s + RELEASE_BOUND_S
    return {
        **free_at, "idle_gpu_h": round(f["idle"] / 3600, 1), "offered_gpu_h": round(f["offered"] / 3600, 1),
        "share_of_idle_offered": round(share, 3), "ideal_share_baseline": round(ideal_share, 3),
        "offered_over_ideal": round(share / ideal_share, 3), "offered_over_ideal_target": SHARE_TARGET,
        "offered_over_ideal_met": share / ideal_share >= SHARE_TARGET,
        "demand_waits": len(day.waits), "demand_to_capacity_p50_s": round(pct(day.waits, 0.5), 1),
        "demand_to_capacity_p95_s": round(pct(day.waits, 0.95), 1),
        "demand_to_capacity_max_s": round(max(day.waits, default=0.0), 1), "demand_to_capacity_target_s": bound,
        "demand_to_capacity_met": max(day.waits, default=0.0) <= bound,
        "offers": int(f["offers"]), "reclaims": int(f["reclaims"]),
        "metered_spot_offered_gpu_h": round(sum(x.offered_gpu_h for x in lines.values()), 1),
        "metered_spot_in_use_gpu_h": round(sum(x.in_use_gpu_h for x in lines.values()), 1),
        "recorded_driver_calls": sum(1 for _ in record.open()),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--notice", type=float, default=30.0, help="reclaim notice, seconds (AWS-style: 120)")
    ap.add_argument("--headroom", type=int, default=4, help="GPUs kept free beyond every claim")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    settings = SpotSettings(headroom_gpus=args.headroom, notice_s=args.notice)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-spot-") as tmp:
        result = {"fleet_gpus": NODES * GPUS_PER_NODE, "step_s": STEP_S, "notice_s": args.notice,
                  "headroom_gpus": args.headroom,
                  **asyncio.run(run_day(settings, args.seed, Path(tmp) / "nvcf.jsonl"))}
    result["bench_wall_s"] = round(time.perf_counter() - t0, 1)
    report(result)


if __name__ == "__main__":
    main()
