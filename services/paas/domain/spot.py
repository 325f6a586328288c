"""Spot capacity: which idle GPUs to sell as spot, which to take back when tenants need them, and how spot use is
metered. Pure: the controller reads a snapshot of the fleet and returns decisions; a provider (an NVCF-shaped
driver, ``services.paas.adapters.spot``) carries them out.

The rule the controller keeps: spot never holds capacity that a tenant's guaranteed quota may still claim, nor
the GPUs tenants have queued for, nor the headroom. Per pool it offers only what is free beyond

    reserve = Σ (guaranteed quota − use) + Σ pending GPUs + headroom

and, as soon as the free GPUs fall below that reserve, it reclaims spot nodes (fewest, most recently offered
first), each with ``notice_s`` of notice; a reclaim has returned its capacity by ``notice_s + RELEASE_BOUND_S``.
"""
from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal, Protocol

ReclaimMode = Literal["cordon", "cordon_and_drain"]
RELEASE_BOUND_S = 30.0      # after the notice, a reclaimed node is empty within this (drain, force-delete)
PRICING_CATEGORY = "Dynamic"  # FOCUS: spot is priced by the market, not the list


class SpotCapacityProvider(Protocol):
    """A market that sells a cluster's idle GPUs (NVIDIA Cloud Functions' cluster agent is the model: a cluster
    registers once; nodes are offered by labelling them for the agent and taken back by cordon, or cordon and
    drain). Every call is idempotent."""

    async def register_cluster(self, name: str, group: str, region: str, compute_platform: str,
                               authorized_nca_ids: tuple[str, ...], attributes: tuple[str, ...]) -> None:
        """Register (or re-register, same values) the cluster; ``name`` is immutable once registered."""

    async def offer_nodes(self, node_ids: tuple[str, ...], gpu_model: str, gpus_per_node: int, until: float) -> None:
        """Make the nodes' GPUs schedulable by spot workloads until ``until`` (unix seconds) at the latest."""

    async def reclaim_nodes(self, node_ids: tuple[str, ...], grace_s: float, mode: ReclaimMode) -> None:
        """Stop new spot work on the nodes; with ``cordon_and_drain``, evict what runs after ``grace_s``."""

    async def report_usage(self) -> dict[str, dict[str, int]]:
        """``{gpu_model: {"offered": GPUs, "in_use": GPUs}}`` now."""

    async def set_maintenance(self, on: bool) -> None:
        """The whole cluster in (cordon-only) maintenance, or back to normal."""

    async def deregister(self) -> None:
        """Remove the cluster from the market; an unregistered cluster is fine."""


@dataclass(frozen=True)
class NodeCapacity:
    """One node of the fleet as the scheduler sees it now."""

    node_id: str
    pool: str
    gpu_model: str
    gpus_total: int
    gpus_free: int                  # free for anyone: neither tenants' nor spot's
    gpus_spot: int = 0              # held by spot (offered, used or not)
    offered_at: float | None = None  # when its spot offer began
    reclaiming: bool = False        # a reclaim is under way: its spot GPUs are on their way back


@dataclass(frozen=True)
class TenantClaim:
    """What one tenant may still claim in a pool."""

    tenant_id: str
    pool: str
    guaranteed_unused: int = 0      # its guaranteed quota minus its use: claimable at any moment
    pending: int = 0                # GPUs its queued work waits for


@dataclass(frozen=True)
class SpotSettings:
    headroom_gpus: int = 4          # per pool, kept free beyond every claim
    notice_s: float = 30.0          # what a spot workload is told before eviction (AWS gives 120 s)
    slot_gpus: int = 0              # 0: offer whole nodes only; n: slots of n GPUs (the spot shape)
    offer_ttl_s: float = 3600.0     # an offer's ``until``; the controller renews what it still offers


@dataclass(frozen=True)
class FleetSnapshot:
    at: float                       # unix seconds (or simulated seconds)
    nodes: tuple[NodeCapacity, ...]
    tenants: tuple[TenantClaim, ...] = ()


@dataclass(frozen=True)
class Offer:
    node_id: str
    gpu_model: str
    gpus: int                       # the node's spot GPUs once offered (what it held plus the new ones)
    until: float


@dataclass(frozen=True)
class Reclaim:
    node_id: str
    gpus: int
    notice_s: float
    returned_by: float              # the capacity is back by then: decision time + notice + RELEASE_BOUND_S
    mode: ReclaimMode = "cordon_and_drain"


@dataclass(frozen=True)
class SpotDecision:
    offers: tuple[Offer, ...] = ()
    reclaims: tuple[Reclaim, ...] = ()


@dataclass(frozen=True)
class PoolBalance:
    """A pool's arithmetic: what may be offered (``spare`` > 0) or must come back (``shortfall`` > 0)."""

    free: int
    reserve: int
    reclaiming: int

    @property
    def spare(self) -> int:
        return max(0, self.free - self.reserve)

    @property
    def shortfall(self) -> int:
        return max(0, self.reserve - self.free - self.reclaiming)


def balance(nodes: Iterable[NodeCapacity], tenants: Iterable[TenantClaim], headroom: int) -> PoolBalance:
    nodes = list(nodes)
    claims = sum(t.guaranteed_unused + t.pending for t in tenants)
    return PoolBalance(free=sum(n.gpus_free for n in nodes), reserve=claims + headroom,
                       reclaiming=sum(n.gpus_spot for n in nodes if n.reclaiming))


def decide(snapshot: FleetSnapshot, settings: SpotSettings) -> SpotDecision:
    """Offers and reclaims for every pool of the snapshot; a pool either offers or reclaims, never both."""
    offers: list[Offer] = []
    reclaims: list[Reclaim] = []
    by_pool: dict[str, list[NodeCapacity]] = defaultdict(list)
    for node in snapshot.nodes:
        by_pool[node.pool].append(node)
    for pool, nodes in sorted(by_pool.items()):
        pool_balance = balance(nodes, (t for t in snapshot.tenants if t.pool == pool), settings.headroom_gpus)
        if pool_balance.shortfall:
            reclaims += choose_reclaims(nodes, pool_balance.shortfall, snapshot.at, settings)
        elif pool_balance.spare:
            offers += choose_offers(nodes, pool_balance.spare, snapshot.at, settings)
    return SpotDecision(tuple(offers), tuple(reclaims))


def choose_offers(nodes: list[NodeCapacity], spare: int, at: float, settings: SpotSettings) -> list[Offer]:
    """Whole free nodes first (largest first, so fewer nodes change hands), then slots of the spot shape on
    partly used nodes; never more than ``spare`` GPUs."""
    out = []
    candidates = sorted((n for n in nodes if not n.reclaiming and n.gpus_free > 0),
                        key=lambda n: (n.gpus_free != n.gpus_total, -n.gpus_free, n.node_id))
    for node in candidates:
        if not settings.slot_gpus and (node.gpus_spot or node.gpus_free != node.gpus_total):
            continue                # whole-node offers only: a node tenants use stays theirs
        unit = settings.slot_gpus or node.gpus_total
        gpus = min(node.gpus_free, spare) // unit * unit
        if gpus:
            out.append(Offer(node.node_id, node.gpu_model, node.gpus_spot + gpus, at + settings.offer_ttl_s))
            spare -= gpus
    return out


def choose_reclaims(nodes: list[NodeCapacity], shortfall: int, at: float, settings: SpotSettings) -> list[Reclaim]:
    """The fewest spot nodes that cover ``shortfall``: the largest spot holdings first (taking the k largest is
    the most any k nodes return), the most recently offered first among equals (the least spot work lost)."""
    held = sorted((n for n in nodes if n.gpus_spot and not n.reclaiming),
                  key=lambda n: (-n.gpus_spot, -(n.offered_at or 0.0), n.node_id))
    out = []
    for node in held:
        if shortfall <= 0:
            break
        out.append(Reclaim(node.node_id, node.gpus_spot, settings.notice_s,
                           at + settings.notice_s + RELEASE_BOUND_S))
        shortfall -= node.gpus_spot
    return out


# --- metering ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SpotSample:
    """What the provider reported for one node at one instant (offered and in use hold until the next sample)."""

    at: float
    node_id: str
    gpu_model: str
    offered: int
    in_use: int


@dataclass(frozen=True)
class SpotUsageRecord:
    """One node's spot use over [start, end) at a constant level: billing rates it as its own line, FOCUS
    ``PricingCategory='Dynamic'``, ``ChargeCategory='Usage'``, consumed in GPU-hours."""

    node_id: str
    gpu_model: str
    start: float                    # inclusive
    end: float                      # exclusive
    gpus_offered: int
    gpus_in_use: int
    pricing_category: str = PRICING_CATEGORY

    @property
    def offered_gpu_s(self) -> float:
        return self.gpus_offered * (self.end - self.start)

    @property
    def in_use_gpu_s(self) -> float:
        return self.gpus_in_use * (self.end - self.start)


def meter(samples: Iterable[SpotSample], until: float) -> list[SpotUsageRecord]:
    """Per node, one record per run of equal (offered, in_use) samples, each lasting to the next change (the
    last to ``until``); runs with nothing offered are left out. Second-exact: no rounding."""
    out: list[SpotUsageRecord] = []
    ordered = sorted(samples, key=lambda s: (s.node_id, s.at))
    for node_id, group in itertools.groupby(ordered, key=lambda s: s.node_id):
        seq = list(group)
        runs = [s for i, s in enumerate(seq)
                if i == 0 or (s.offered, s.in_use) != (seq[i - 1].offered, seq[i - 1].in_use)]
        for run, nxt in zip(runs, [*runs[1:], None]):
            end = min(until, nxt.at) if nxt else until
            if run.offered and end > run.at:
                out.append(SpotUsageRecord(node_id, run.gpu_model, run.at, end, run.offered, run.in_use))
    return out


@dataclass
class SpotLine:
    """What one GPU model's spot earned in a period: offered and used GPU-hours."""

    gpu_model: str
    offered_gpu_h: float = 0.0
    in_use_gpu_h: float = 0.0
    nodes: set[str] = field(default_factory=set)


def aggregate(records: Iterable[SpotUsageRecord], start: float, end: float) -> dict[str, SpotLine]:
    """Per GPU model, the records' GPU-hours inside [start, end) (a record crossing a bound counts its part)."""
    lines: dict[str, SpotLine] = {}
    for r in records:
        lo, hi = max(r.start, start), min(r.end, end)
        if hi <= lo:
            continue
        line = lines.setdefault(r.gpu_model, SpotLine(r.gpu_model))
        line.offered_gpu_h += r.gpus_offered * (hi - lo) / 3600
        line.in_use_gpu_h += r.gpus_in_use * (hi - lo) / 3600
        line.nodes.add(r.node_id)
    return lines
