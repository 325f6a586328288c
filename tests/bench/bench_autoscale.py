"""How soon the cluster autoscaler acts on a step in load: a simulation on a fake clock, not a test.

`python -m tests.bench.bench_autoscale [--steps 200] [--before 0.3] [--after 0.95] [--delay 0] [--sample 5]
[--no-tick-sample] [--seed 7]`

Two 1-GPU nodes at a 0.70 target run at ``before`` for 200 s, then at ``after``. As in the PaaS service
(``handlers/autoscale.py``), a sample of every node is taken every ``--sample`` seconds at a random phase against
the ticks, and ``domain.autoscale.decide`` runs every 15 s on a sample taken at the tick (``--no-tick-sample``:
on the sampling loop's alone, as the handler did before). ``--delay`` is how late a sample sees the load (with
GPU metrics, the node-agents' heartbeat period: 2 s). Each run draws the step's instant and the sampling phase;
the figure is the time from the step to the first scale-out, with the surge rule and with the window's mean
alone (the rule before it). The last line is one JSON object with every figure.
"""
from __future__ import annotations

import argparse
import json
import random

from services.paas.domain.autoscale import (
    TICK_S,
    ClusterState,
    Hold,
    NodeSample,
    Sample,
    ScalingPolicy,
    Window,
    decide,
)

SAMPLE_S = TICK_S / 3
TARGET = 0.7
WARM_S = 200.0      # longer than the window: the step meets a settled cluster


class MeanOnly(Window):
    """The window without the surge rule's evidence: what the autoscaler decided on before it."""

    def recent_utils(self, now: float) -> list[float]:
        return []


def step_to_decision(step_at: float, sample_phase: float, *, before: float = 0.3, after: float = 0.95,
                     delay_s: float = 0.0, window: Window | None = None, tick_sample: bool = True,
                     sample_s: float = SAMPLE_S) -> tuple[float, str]:
    """Seconds from the step (at ``step_at`` ≥ ``WARM_S``) to the first change, and its reason. Ticks are at
    every multiple of ``TICK_S``; the sampling loop's samples at ``sample_phase`` + k·``sample_s`` (the surge span,
as the handler sets it)."""
    policy = ScalingPolicy(min_nodes=1, max_nodes=4, target_gpu_util=TARGET)
    window = window if window is not None else Window(surge_s=sample_s)   # an empty one is falsy: it has a __len__
    state = ClusterState(nodes=("c-0", "c-1"))

    def sample(t: float) -> Sample:
        util = after if t - delay_s >= step_at else before
        return Sample(t, (NodeSample("c-0", util, 1), NodeSample("c-1", util, 1)))

    next_sample, next_tick = sample_phase, TICK_S
    while next_tick < step_at + 10 * WARM_S:
        if next_sample <= next_tick:     # at the same instant the sampling loop's sample goes in first
            window.add(sample(next_sample))
            next_sample += sample_s
            continue
        if tick_sample:
            window.add(sample(next_tick))
        decision = decide(policy, window, state, next_tick)
        if not isinstance(decision, Hold) and next_tick >= step_at:
            return next_tick - step_at, decision.reason
        next_tick += TICK_S
    raise AssertionError("no decision")


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def measure(steps: int, before: float, after: float, delay_s: float, tick_sample: bool, sample_s: float,
            seed: int) -> dict:
    rng = random.Random(seed)
    surge, mean_only = [], []
    run = {"before": before, "after": after, "delay_s": delay_s, "tick_sample": tick_sample, "sample_s": sample_s}
    for _ in range(steps):
        step_at, phase = WARM_S + rng.uniform(0.0, TICK_S), rng.uniform(0.0, sample_s)
        surge.append(step_to_decision(step_at, phase, **run)[0])
        mean_only.append(step_to_decision(step_at, phase, window=MeanOnly(), **run)[0])
    return {"steps": steps, "target": TARGET, **run,
            "step_to_decision_p50_s": round(pct(surge, 0.5), 1), "step_to_decision_max_s": round(max(surge), 1),
            "mean_only_p50_s": round(pct(mean_only, 0.5), 1), "mean_only_max_s": round(max(mean_only), 1),
            "within_20_s": sum(1 for x in surge if x <= 20.0)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200, help="random step instants and sampling phases")
    ap.add_argument("--before", type=float, default=0.3)
    ap.add_argument("--after", type=float, default=0.95)
    ap.add_argument("--delay", type=float, default=0.0, help="seconds a sample lags the load")
    ap.add_argument("--sample", type=float, default=SAMPLE_S, help="the sampling loop's period, seconds")
    ap.add_argument("--no-tick-sample", dest="tick_sample", action="store_false",
                    help="decide on the sampling loop's samples alone")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    print(json.dumps(measure(args.steps, args.before, args.after, args.delay, args.tick_sample, args.sample,
                             args.seed)))


if __name__ == "__main__":
    main()
