"""When a tenant cluster grows or shrinks, from its GPU use and its scheduler's queue (pure: no I/O, clock injected).

The loop is NVIDIA's function autoscaler's (NVIDIA/nvcf, ``function-autoscaler``): a decision every 15 s on the
mean GPU utilisation over the last 70 s. Feed :class:`Window` every sample as it comes (the node-agents report
every few seconds), call :func:`decide` every ``TICK_S``.

- Scale out when jobs wait for resources (at once, even inside the cool-down: a queue is a user waiting, and
  Kubernetes' cluster-autoscaler does not delay scale-up either), or when the window's mean utilisation is above
  the target (after the cool-down: a node just added needs a window before the mean shows it), or when the
  newest sample and every one of the ``SURGE_S`` before it (at least two) are above the target: the surge rule.
  The mean lags a step in load by up to the window (25–75 s for a step from 0.5 to 0.75–1.0 at 0.70); the
  surge rule acts at the first tick with two samples after the step, so within ``TICK_S + SURGE_S`` (20 s) of
  it when a sample is taken at the tick. It obeys the cool-down and the maximum like the mean.
- Scale in only nodes idle over the whole window (no running job, utilisation at most ``IDLE_UTIL``), never
  ``nodes[0]`` (the controller), newest first, never below ``min_nodes``, and only while the utilisation the
  remaining nodes would carry (at the window's mean or the latest samples', whichever is higher: a load that
  has just risen is not spread yet) stays ``hysteresis`` below the target: without that band a cluster whose
  load sits at the target removes a node, climbs over the target, adds it back, and so on.
- Nothing changes while a change is in flight (nodes joining or draining) or within ``cooldown_s`` of the last
  one (pending jobs excepted, as said).

A ``ScaleIn`` names nodes to drain; the caller drains them, waits for the scheduler's ``drained`` and only then
removes them (``ClusterRuntime.set_nodes``), so running work always finishes.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

TICK_S = 15.0       # NVCF: default scaling_loop_interval
WINDOW_S = 70.0     # NVCF: default utilization_window_seconds
IDLE_UTIL = 0.05    # "~0": a node at or under this, with no job, does nothing worth keeping it for
SURGE_S = TICK_S / 3    # the handler's sampling period: two samples this close, both over, are a surge


@dataclass(frozen=True)
class ScalingPolicy:
    """A cluster's autoscaling bounds. ``hysteresis``: how far under ``target_gpu_util`` the nodes left after a
    scale-in must stay (absolute utilisation, 0–1)."""

    min_nodes: int
    max_nodes: int
    target_gpu_util: float
    cooldown_s: float = 300.0
    scale_out_step: int = 1
    scale_in_step: int = 1
    hysteresis: float = 0.1

    def __post_init__(self) -> None:
        if self.min_nodes < 1:
            raise ValueError("min_nodes must be at least 1: nodes[0] hosts the controller")
        if self.max_nodes < self.min_nodes:
            raise ValueError("max_nodes must be at least min_nodes")
        if not 0.0 < self.target_gpu_util <= 1.0:
            raise ValueError("target_gpu_util must be in (0, 1]")
        if self.cooldown_s < 0:
            raise ValueError("cooldown_s must not be negative")
        if self.scale_out_step < 1 or self.scale_in_step < 1:
            raise ValueError("scale steps must be at least 1")
        if not 0.0 <= self.hysteresis < self.target_gpu_util:
            raise ValueError("hysteresis must be in [0, target_gpu_util)")


@dataclass(frozen=True)
class NodeSample:
    """One node at one instant: its GPUs' mean utilisation (0–1), its running jobs, and its GPU count (the
    weight of its utilisation in the cluster's)."""

    name: str
    gpu_util: float
    running_jobs: int = 0
    gpus: int = 1

    @property
    def idle(self) -> bool:
        return self.running_jobs == 0 and self.gpu_util <= IDLE_UTIL


@dataclass(frozen=True)
class Sample:
    """Every node of the cluster at ``at`` (seconds, on the injected clock)."""

    at: float
    nodes: tuple[NodeSample, ...]


@dataclass
class _NodeTrack:
    idle_since: float | None    # start of the current unbroken idle run; None while busy
    last_seen: float
    gpus: int


class Window:
    """The last ``span_s`` seconds of samples, as running sums: each sample adds one entry, dropped once, so
    memory is O(1) per sample (amortised) whatever the node count, plus O(1) per current node.

    A node's idle run breaks when it is busy, or when its samples stop for more than ``max_gap_s`` (what was
    not seen is not known to be idle), or when it is missing from a sample (its state is then forgotten).
    """

    def __init__(self, span_s: float = WINDOW_S, max_gap_s: float = TICK_S, surge_s: float = SURGE_S) -> None:
        if not 0 < surge_s <= span_s:
            raise ValueError("surge_s must be in (0, span_s]")
        self.span_s = span_s
        self.max_gap_s = max_gap_s
        self.surge_s = surge_s
        self._entries: deque[tuple[float, float, int]] = deque()   # (at, Σ util·gpus, Σ gpus)
        self._busy = 0.0
        self._gpus = 0
        self._nodes: dict[str, _NodeTrack] = {}
        self._latest: float | None = None

    def add(self, sample: Sample) -> None:
        """Take a sample; samples come in time order (an older one than the latest is refused)."""
        if self._latest is not None and sample.at < self._latest:
            raise ValueError(f"sample at {sample.at} is older than the latest, {self._latest}")
        self._latest = sample.at
        busy = sum(n.gpu_util * n.gpus for n in sample.nodes)
        gpus = sum(n.gpus for n in sample.nodes)
        self._entries.append((sample.at, busy, gpus))
        self._busy += busy
        self._gpus += gpus
        self._track(sample)
        self._evict(sample.at)

    def _track(self, sample: Sample) -> None:
        seen = {}
        for n in sample.nodes:
            old = self._nodes.get(n.name)
            unbroken = old is not None and old.idle_since is not None and sample.at - old.last_seen <= self.max_gap_s
            since = (old.idle_since if unbroken else sample.at) if n.idle else None
            seen[n.name] = _NodeTrack(idle_since=since, last_seen=sample.at, gpus=n.gpus)
        self._nodes = seen

    def _evict(self, now: float) -> None:
        while self._entries and self._entries[0][0] <= now - self.span_s:
            _, busy, gpus = self._entries.popleft()
            self._busy -= busy
            self._gpus -= gpus
        if not self._entries:   # start again from exact zeros rather than carry the float residue
            self._busy, self._gpus = 0.0, 0

    def __len__(self) -> int:
        return len(self._entries)

    def mean_util(self, now: float) -> float | None:
        """The GPU-weighted mean utilisation of the samples within ``span_s`` of ``now``; None without any (or
        without GPUs)."""
        self._evict(now)
        if self._gpus <= 0:
            return None
        return max(0.0, self._busy / self._gpus)

    def recent_utils(self, now: float) -> list[float]:
        """The utilisation of the newest sample up to ``now`` and of each sample taken within ``surge_s``
        before it (both ends included), newest first; a sample without GPUs counts as 0."""
        recent: list[float] = []
        newest = None
        for at, busy, gpus in reversed(self._entries):
            if at > now:
                continue
            newest = at if newest is None else newest
            if at < newest - self.surge_s:
                break
            recent.append(max(0.0, busy / gpus) if gpus > 0 else 0.0)
        return recent

    def fresh(self, now: float) -> bool:
        """Whether the latest sample is recent enough to act on (within ``max_gap_s``)."""
        return self._latest is not None and now - self._latest <= self.max_gap_s

    def idle_whole_window(self, node: str, now: float) -> bool:
        """Whether ``node`` was seen idle, without a gap, for the whole window up to a fresh sample."""
        track = self._nodes.get(node)
        return (track is not None and track.idle_since is not None
                and now - track.last_seen <= self.max_gap_s and track.idle_since <= now - self.span_s)

    def gpus(self, node: str) -> int:
        track = self._nodes.get(node)
        return track.gpus if track else 0

    def total_gpus(self) -> int:
        """GPUs of the nodes in the latest sample."""
        return sum(t.gpus for t in self._nodes.values())


@dataclass(frozen=True)
class ClusterState:
    """The cluster as the caller knows it at a tick. ``nodes``: names in the order they were added (``nodes[0]``
    is the controller, the last the newest); ``last_change_at``: when the last scale change was decided."""

    nodes: tuple[str, ...]
    pending_jobs: int = 0
    joining: frozenset[str] = field(default_factory=frozenset)
    draining: frozenset[str] = field(default_factory=frozenset)
    last_change_at: float | None = None


@dataclass(frozen=True)
class Hold:
    reason: str


@dataclass(frozen=True)
class ScaleOut:
    count: int
    reason: str


@dataclass(frozen=True)
class ScaleIn:
    nodes: tuple[str, ...]      # to drain, then remove; newest first
    reason: str


Decision = Hold | ScaleOut | ScaleIn


def decide(policy: ScalingPolicy, window: Window, state: ClusterState, now: float) -> Decision:
    """The change to make now, if any (see the module's rules)."""
    if state.joining or state.draining:
        busy = sorted(state.joining | state.draining)
        return Hold(f"a change is in progress ({', '.join(busy)} joining or draining)")
    size = len(state.nodes)
    if size < policy.min_nodes:
        return ScaleOut(policy.min_nodes - size, f"{size} node(s), under the minimum of {policy.min_nodes}")
    if size > policy.max_nodes:
        extra = _newest_first(state.nodes)[:size - policy.max_nodes]
        return ScaleIn(extra, f"{size} node(s), over the maximum of {policy.max_nodes}")
    if state.pending_jobs > 0:
        if size >= policy.max_nodes:
            return Hold(f"{state.pending_jobs} job(s) pending, at the maximum of {policy.max_nodes} node(s)")
        return ScaleOut(min(policy.scale_out_step, policy.max_nodes - size), f"{state.pending_jobs} job(s) pending")
    cooling = _cooldown_left(policy, state, now)
    if cooling > 0:
        return Hold(f"cool-down: {cooling:.0f} s left")
    if not window.fresh(now):
        return Hold("no recent GPU sample")
    mean = window.mean_util(now)
    recent = window.recent_utils(now)
    over = _over_target(policy, window, mean, recent)
    if over is not None:
        if size >= policy.max_nodes:
            return Hold(f"{over}, at the maximum")
        return ScaleOut(min(policy.scale_out_step, policy.max_nodes - size), over)
    return _scale_in(policy, window, state, now, max([mean or 0.0, *recent]))


def _over_target(policy: ScalingPolicy, window: Window, mean: float | None, recent: list[float]) -> str | None:
    """Why the load is over the target (the window's mean, else a surge), or None."""
    target = policy.target_gpu_util
    if mean is not None and mean > target:
        return f"window utilisation {mean:.2f} over the target {target:.2f}"
    if len(recent) >= 2 and min(recent) > target:
        return f"utilisation at least {min(recent):.2f} over the target {target:.2f} for {window.surge_s:g} s"
    return None


def _cooldown_left(policy: ScalingPolicy, state: ClusterState, now: float) -> float:
    if state.last_change_at is None:
        return 0.0
    return policy.cooldown_s - (now - state.last_change_at)


def _newest_first(nodes: Sequence[str]) -> tuple[str, ...]:
    return tuple(reversed(nodes[1:]))   # never nodes[0]: it hosts the controller


def _scale_in(policy: ScalingPolicy, window: Window, state: ClusterState, now: float, load: float) -> Decision:
    """``load``: the utilisation the current nodes carry, as the scale-in must assume it."""
    room = min(policy.scale_in_step, len(state.nodes) - policy.min_nodes)
    if room <= 0:
        return Hold(f"utilisation {load:.2f}; at the minimum of {policy.min_nodes} node(s)")
    idle = [n for n in _newest_first(state.nodes) if window.idle_whole_window(n, now)]
    if not idle:
        return Hold(f"utilisation {load:.2f}; no node idle for the whole {window.span_s:.0f} s window")
    ceiling = policy.target_gpu_util - policy.hysteresis
    total = window.total_gpus()
    chosen: list[str] = []
    for name in idle[:room]:
        left = total - window.gpus(name)
        # The load spread over the GPUs that would remain: what the cluster would run at without these nodes.
        projected = load * total / left if left > 0 else (0.0 if load == 0 else float("inf"))
        if projected > ceiling:
            break
        chosen.append(name)
        total = left
    if not chosen:
        return Hold(f"utilisation {load:.2f}; removing {idle[0]} would leave over {ceiling:.2f}")
    return ScaleIn(tuple(chosen), f"{', '.join(chosen)} idle for {window.span_s:.0f} s, utilisation {load:.2f}")
