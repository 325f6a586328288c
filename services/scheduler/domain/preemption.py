"""Choosing preemption victims (pure, no I/O).

Who may preempt whom: a spot request preempts nothing. A regular request may preempt spot
allocations (of any priority) and regular allocations of strictly lower priority. Never below
the victim tenant's guaranteed quota for that (model, pool): a victim is taken only while its
tenant's use there stays at or above the guarantee after every chosen victim is gone.

Victim set: on ONE node (a placement never spans nodes), the set whose release makes the
request fit there. Per node, victims are added greedily - spot first, then lowest priority,
then the largest (fewer victims), then the youngest (least work lost) - until the request fits,
then any victim not needed is dropped again, so the set is irredundant. Across nodes the best
set wins by (highest victim class, number of victims, GPUs freed): a set of spot allocations
beats any set touching a regular one, and a lower-priority set beats a smaller higher one.
Only nodes that hold a preemptable allocation are looked at (the index's ``preempt`` sets), at
most ``max_nodes`` of them (a bounded search: the best set among those, not the global optimum;
~30 us per node), and a single spot victim ends the search early: it cannot be beaten.
"""
from __future__ import annotations

import uuid
from collections.abc import Iterable

from .inventory import Inventory, Placement, Request
from .node_slots import NodeSlots
from .quota import QuotaBook, QuotaKey


def can_preempt(req: Request, victim: Request) -> bool:
    """Whether ``req`` may preempt an allocation made for ``victim``."""
    return not req.spot and (victim.spot or victim.priority < req.priority)


def _class_ok(req: Request, cls: tuple) -> bool:
    return not req.spot and (cls == ("spot",) or cls[1] < req.priority)


_SPOT_RANK = -(1 << 30)


def _rank(victim: Request) -> int:
    """Lower goes first: spot before everything, then by priority."""
    return _SPOT_RANK if victim.spot else victim.priority


def select_victims(inv: Inventory, quotas: QuotaBook, req: Request, *,
                   exclude: Iterable[uuid.UUID] = (), max_nodes: int = 64) -> list[uuid.UUID] | None:
    """Allocations whose release makes ``req`` fit on one node, or None if no such set exists.
    ``exclude``: allocations already being preempted (not counted twice). Does not mutate."""
    if req.spot:
        return None
    exclude = set(exclude)
    best, best_score, seen = None, None, set()
    for part in inv.eligible(req):
        for cls, ids in part.preempt.items():
            if not _class_ok(req, cls):
                continue
            for nid in ids:
                if nid in seen:
                    continue
                seen.add(nid)
                node = inv.node(nid)
                if node is None or not node.state.approved or node.state.cordoned \
                        or node.reserved_for not in (None, req.allocation_id):
                    continue
                found = _victims_on(node, req, quotas, exclude)
                if found is not None and (best_score is None or found[1] < best_score):
                    best, best_score = found
                    if best_score[:2] == (_SPOT_RANK, 1):
                        return best
                if len(seen) >= max_nodes:
                    return best
    return best


def _victims_on(node: NodeSlots, req: Request, quotas: QuotaBook, exclude: set):
    """(victims, score) on this node, or None."""
    cands = [(aid, v, p) for aid, (v, p) in node.allocs.items() if aid not in exclude and can_preempt(req, v)]
    if req.shape.kind != "mig" and len(node.free) + sum(len(c[2].slots) for c in cands
                                                        if c[2].mig_profile is None) < req.shape.gpu_count:
        return None       # even every preemptable whole-GPU allocation would not make room
    cands.sort(key=lambda c: (_rank(c[1]), -c[1].shape.quota_units, -c[1].enqueued_at))
    chosen: list[tuple] = []
    taken: dict[QuotaKey, int] = {}
    for c in cands:
        key = QuotaKey(c[1].tenant_id, c[2].gpu_model, c[2].pool)
        units = c[1].shape.quota_units
        if quotas.used(key) - taken.get(key, 0) - units < quotas.guaranteed(key):
            continue      # would cut into the tenant's guaranteed quota
        taken[key] = taken.get(key, 0) + units
        chosen.append(c)
        if _fits(node, req, chosen):
            break
    else:
        return None
    for c in list(reversed(chosen)):     # drop what is not needed: an irredundant set
        rest = [x for x in chosen if x is not c]
        if rest and _fits(node, req, rest):
            chosen = rest
    score = (max(_rank(c[1]) for c in chosen), len(chosen), sum(c[1].shape.quota_units for c in chosen))
    return [c[0] for c in chosen], score


def _fits(node: NodeSlots, req: Request, victims: list[tuple]) -> bool:
    free = set(node.free)
    mig = {s: list(v) for s, v in node.mig.items()}
    for _, _, p in victims:
        _release(free, mig, p)
    return node.pick(req.shape, free, mig) is not None


def _release(free: set, mig: dict, p: Placement) -> None:
    for s in p.slots:
        if p.mig_profile is None:
            free.add(s)
        elif s in mig:
            mig[s][1] -= 1
            if mig[s][1] <= 0:
                del mig[s]
                free.add(s)
