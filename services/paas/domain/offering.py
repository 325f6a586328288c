"""A provider's spot offering, live (pure; no I/O): which spot nodes to add, which to take back, and when.

An offering holds a pool's idle GPUs as spot allocations of the provider's spot tenant (a node is one allocation
of the offering's shape), each offered to the spot market once ACTIVE. It keeps the spot controller's rule
(``domain.spot``): spot never holds what tenants may claim at any moment.

    reserve = the scheduler's spot reserve for the pool (unused guaranteed quota + pending non-spot GPUs) + headroom
    spare   = free − reserve                          → request spare // gpus more nodes, up to max_nodes
    short   = reserve − free − GPUs being reclaimed   → reclaim ⌈short / gpus⌉ nodes, the newest offers first

A step acts only on the scheduler's figures taken after the offering's last change, and grows only when no node
it asked for is still unplaced: the same idle GPUs are never counted twice. A node comes back in one of two ways:
- the offering reclaims it (the reserve grew, or it was disabled): the market gets ``notice_s`` of notice, and at
  its end the allocation is released;
- the scheduler preempts it for a tenant's request: its notice (the preemption grace) reaches the market the same
  way, and the scheduler releases it at its end.
"""
from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field

LIVE = frozenset({"requested", "offered", "reclaiming"})
KEEP_ENDED = 10                 # ended nodes kept on the offering (newest): what just happened stays visible
_NS = uuid.UUID("7d3e3a52-0c55-4f0f-8a0e-4f1b7b1c5e11")


def node_allocation_id(pool: str, index: int) -> uuid.UUID:
    """The allocation id of a pool's ``index``-th spot node (stable: a redelivered step asks for the same one)."""
    return uuid.uuid5(_NS, f"spot:{pool}:{index}")


@dataclass
class SpotNode:
    allocation_id: uuid.UUID
    gpus: int
    state: str                          # requested | offered | reclaiming | released | failed
    requested_at: float
    node_id: uuid.UUID | None = None
    offered_at: float | None = None
    reclaim_by: float | None = None     # the notice ends: the node is taken back then
    reclaim_reason: str | None = None
    release_due: bool = False           # the offering releases it at ``reclaim_by`` (not the scheduler)
    release_sent: bool = False
    ended_at: float | None = None
    told: str | None = None             # the state the market was last told of

    @property
    def live(self) -> bool:
        return self.state in LIVE

    def held_s(self, now: float) -> float:
        """Seconds it has held its GPUs for spot (from its offer to its end, or now)."""
        if self.offered_at is None:
            return 0.0
        return max(0.0, (self.ended_at if self.ended_at is not None else now) - self.offered_at)


@dataclass
class Decision:
    grow: int = 0
    reclaim: list[SpotNode] = field(default_factory=list)


@dataclass
class Offering:
    pool: str
    tenant_id: uuid.UUID
    user_id: uuid.UUID
    shape: str
    gpu_count: int
    cluster_name: str
    gpu_model: str = "GPU"
    enabled: bool = True
    max_nodes: int = 64
    headroom_gpus: int = 0
    notice_s: int = 30
    tolerations: list[str] = field(default_factory=list)
    group: str = "tessera"
    region: str = "local"
    nodes: list[SpotNode] = field(default_factory=list)
    next_index: int = 0
    changed_at: float = 0.0             # the last change of its nodes: a decision waits for newer figures
    ended_gpu_s: float = 0.0            # GPU-seconds held by nodes no longer listed
    reclaims_total: int = 0
    free_gpus: int | None = None
    reserve_gpus: int | None = None
    reason: str | None = None
    market_usage: dict = field(default_factory=dict)   # the market's last report_usage: {model: {offered, in_use}}
    version: int = 0

    @property
    def live(self) -> list[SpotNode]:
        return [n for n in self.nodes if n.live]

    def node(self, allocation_id: uuid.UUID) -> SpotNode | None:
        return next((n for n in self.nodes if n.allocation_id == allocation_id), None)

    @property
    def offered_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes if n.state == "offered")

    def held_gpu_s(self, now: float) -> float:
        return self.ended_gpu_s + sum(n.gpus * n.held_s(now) for n in self.nodes)


def decide(off: Offering, *, free: int, reserve: int, figures_at: float) -> Decision:
    """What the scheduler's figures (``free`` GPUs in the pool, its spot ``reserve``, taken at ``figures_at``)
    ask of the offering. Records the figures on it."""
    off.free_gpus, off.reserve_gpus = free, reserve + off.headroom_gpus
    if not off.enabled or figures_at <= off.changed_at:
        return Decision()
    reclaiming = sum(n.gpus for n in off.nodes if n.state == "reclaiming")
    short = off.reserve_gpus - free - reclaiming
    if short > 0:
        offered = sorted((n for n in off.nodes if n.state == "offered"),
                         key=lambda n: (-(n.offered_at or 0.0), str(n.allocation_id)))
        return Decision(reclaim=offered[:math.ceil(short / off.gpu_count)])
    if any(n.state == "requested" for n in off.nodes):
        return Decision()
    room = off.max_nodes - len(off.live)
    return Decision(grow=max(0, min(room, (free - off.reserve_gpus) // off.gpu_count)))


def grow(off: Offering, count: int, now: float) -> list[SpotNode]:
    """``count`` new nodes, requested now."""
    new = [SpotNode(node_allocation_id(off.pool, off.next_index + i), off.gpu_count, "requested", now)
           for i in range(count)]
    off.next_index += count
    off.nodes.extend(new)
    if new:
        off.changed_at = now
    return new


def reclaim(off: Offering, node: SpotNode, now: float, *, by: float, reason: str, release_due: bool) -> bool:
    """Take ``node`` back at ``by`` (the notice's end); ``release_due``: the offering releases it then (else the
    scheduler does). False when it is not offered (being reclaimed already, not placed yet, or ended)."""
    if node.state != "offered":
        return False
    node.state, node.reclaim_by, node.reclaim_reason, node.release_due = "reclaiming", by, reason, release_due
    off.reclaims_total += 1
    off.changed_at = now
    return True


def activated(off: Offering, node: SpotNode, node_id: uuid.UUID, now: float) -> None:
    """Placed and ACTIVE: offered to the market (or reclaimed at once when the offering was disabled meanwhile)."""
    if node.state != "requested":
        return
    node.state, node.node_id, node.offered_at = "offered", node_id, now
    off.changed_at = now
    if not off.enabled:
        reclaim(off, node, now, by=now + off.notice_s, reason="the offering is disabled", release_due=True)


def ended(off: Offering, node: SpotNode, state: str, now: float) -> None:
    """Released or failed: its GPUs are the pool's again."""
    if not node.live:
        return
    node.state, node.ended_at = state, now
    off.changed_at = now
    done = [n for n in off.nodes if not n.live]
    for old in sorted(done, key=lambda n: n.ended_at or 0.0)[:max(0, len(done) - KEEP_ENDED)]:
        off.ended_gpu_s += old.gpus * old.held_s(now)
        off.nodes.remove(old)


def disable(off: Offering, now: float) -> None:
    """Stop growing and take every offered node back with notice (nodes not placed yet follow once ACTIVE)."""
    off.enabled = False
    for node in off.nodes:
        reclaim(off, node, now, by=now + off.notice_s, reason="the offering is disabled", release_due=True)


def due_releases(off: Offering, now: float) -> list[SpotNode]:
    """Nodes whose notice has ended and which the offering itself must release now."""
    return [n for n in off.nodes if n.state == "reclaiming" and n.release_due and not n.release_sent
            and n.reclaim_by is not None and n.reclaim_by <= now]


def untold(off: Offering) -> list[SpotNode]:
    """Nodes whose state the market has not been told yet (a node ending unplaced had nothing to tell)."""
    return [n for n in off.nodes if n.told != n.state and (n.state != "requested")
            and not (n.offered_at is None and not n.live)]
