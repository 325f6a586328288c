"""The scheduler: quotas, placement, the fair queue, reservations and preemption together (pure).

- ``submit``: over quota (or no quota) -> rejected, naming the quota; fits -> placed (slots held,
  quota charged); otherwise rejected when the request asked to fail fast, else queued. A queued
  regular request that could fit by preempting gets ``victims`` (one node; see preemption.py): that
  node is reserved for it at once, so the capacity the victims free goes to it and nobody else.
  The caller sends the notices, runs the release saga for each victim, then calls ``release``.
- ``release``/``tick``: re-evaluate the queue: first the requests holding a reservation, then the
  pending requests in fair order (queue.py), at most ``max_scan`` of them per pass; a request whose
  (shape, pool, tolerations, admitted quota) already failed in this pass is not tried again.
- No starvation (reservation, not aging of priorities): when a request has waited ``aging_s`` and
  still does not fit, it reserves the eligible node closest to fitting (most free slots); backfill
  may not use that node, which therefore drains until the request fits there. As in EASY
  backfill, only the first such request in fair order gets one: at most one aging reservation per
  partition (pool, model, taints), one new per pass, ``max_reservations`` in all (preemption
  reservations included).
Single-threaded; the clock is injected (``clock()`` -> seconds) so tests control time.
"""
from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

from .gang_scheduling import GangScheduling
from .inventory import Inventory, Placement, Request
from .preemption import select_victims
from .queue import FairQueue, QueueFull, demand_kind
from .quota import QuotaBook, QuotaKey, QuotaVerdict


@dataclass(frozen=True)
class Decision:
    kind: Literal["placed", "queued", "rejected"]
    placement: Placement | None = None
    reason: str = ""
    quota_verdict: QuotaVerdict | None = None
    victims: tuple[uuid.UUID, ...] = ()


class Scheduler(GangScheduling):
    def __init__(self, inv: Inventory, quotas: QuotaBook, queue: FairQueue, *, aging_s: float,
                 clock: Callable[[], float] = time.monotonic, max_scan: int = 1000,
                 max_reservations: int = 64, preempt: bool = True) -> None:
        self.inv, self.quotas, self.queue = inv, quotas, queue
        self.aging_s, self.clock, self.max_scan = aging_s, clock, max_scan
        self.max_reservations, self.preempt = max_reservations, preempt
        self.usage: dict[uuid.UUID, int] = {}                 # tenant -> GPUs held
        self.reservations: dict[uuid.UUID, uuid.UUID] = {}    # pending allocation -> reserved node
        self.preempting: dict[uuid.UUID, uuid.UUID] = {}      # victim allocation -> preemptor
        self._gang_state()                                    # waiting and newly placed gangs (gang_scheduling.py)

    # ---- commands
    def submit(self, req: Request) -> Decision:
        """Decide a new request (see module docstring). Idempotent on allocation_id: a held
        allocation answers placed with its placement, a pending one queued."""
        held = self.inv.holding(req.allocation_id)
        if held is not None:
            return Decision("placed", held[1], "already placed")
        if req.allocation_id in self.queue:
            return Decision("queued", reason="already pending")
        verdict, admitted = self._quota(req)
        if not admitted:
            return Decision("rejected", reason=verdict.reason if verdict else self._nowhere(req),
                            quota_verdict=verdict)
        if req.enqueued_at == 0.0:
            req = replace(req, enqueued_at=self.clock())
        p = self.inv.place(req, admit=admitted.__contains__)
        if p is not None:
            return Decision("placed", p, "placed", self._grant(req, p))
        if req.fail_fast:
            return Decision("rejected", reason=self._no_capacity(req), quota_verdict=verdict)
        victims = self._victims(req) if self.preempt else None
        try:
            self.queue.push(req)
        except QueueFull as exc:
            return Decision("rejected", reason=str(exc), quota_verdict=verdict)
        if victims:
            self._reserve(req.allocation_id, self.inv.holding(victims[0])[1].node_id)
            for v in victims:
                self.preempting[v] = req.allocation_id
            return Decision("queued", reason=f"preempting {len(victims)} allocation(s)",
                            quota_verdict=verdict, victims=tuple(victims))
        return Decision("queued", reason=self._no_capacity(req), quota_verdict=verdict)

    def release(self, allocation_id: uuid.UUID) -> list[tuple[Request, Placement]]:
        """Free what the allocation holds (or cancel it if pending), refund its quota, then
        re-evaluate the queue; returns the requests placed now (already held). Idempotent."""
        self.preempting.pop(allocation_id, None)
        held = self.inv.holding(allocation_id)
        if held is None:      # pending (a cancel) or already released (nothing to do)
            return self.tick() if self.cancel(allocation_id) is not None else []
        req, p = held
        self.inv.free(allocation_id)
        units = req.shape.quota_units
        self.quotas.refund(QuotaKey(req.tenant_id, p.gpu_model, p.pool), units)
        self._use(req.tenant_id, -units)
        return self._pass(p.node_id, req.tenant_id)

    def cancel(self, allocation_id: uuid.UUID) -> Request | None:
        """Withdraw a pending request and its reservation; None if it was not pending. Call
        ``tick`` afterwards: capacity its reservation kept may now serve others."""
        if allocation_id in self.gangs:
            return self.cancel_gang(allocation_id).template
        self._drop_claims(allocation_id)
        return self.queue.cancel(allocation_id)

    def spot_reserve(self) -> dict[str, int]:
        """Pool -> the GPUs tenants may claim there at any moment, which spot capacity must leave free: unused
        guaranteed quota plus what pending non-spot requests wait for (a waiting gang: every member; a request
        for any pool counts in every pool)."""
        waiting = self.queue.pending_gpus({g.gang_id: len(g.members) for g in self.gangs.values()})
        anywhere = waiting.pop(None, 0)
        guaranteed = self.quotas.unused_guarantees()
        pools = {pool for pool, _model in self.inv.utilisation()} | set(guaranteed) | set(waiting)
        return {p: guaranteed.get(p, 0) + waiting.get(p, 0) + anywhere for p in sorted(pools)}

    def adopt(self, req: Request, placement: Placement) -> None:
        """Load an existing holding (service start-up): hold, charge quota, count use; no checks
        beyond slot availability (raises SlotTaken). Idempotent."""
        if self.inv.holding(req.allocation_id) is None:
            self._grant(req, placement)

    def unplace(self, allocation_id: uuid.UUID) -> None:
        """Undo a placement the database refused: free its slots, refund its quota and use, without
        re-running the queue (unlike ``release``). Idempotent."""
        held = self.inv.holding(allocation_id)
        if held is None:
            return
        req, p = held
        self.inv.free(allocation_id)
        self.quotas.refund(self._key(req, p), req.shape.quota_units)
        self._use(req.tenant_id, -req.shape.quota_units)

    def restore_nomination(self, allocation_id: uuid.UUID, node_id: uuid.UUID) -> None:
        """Load a pending request's node reservation (service start-up); the request must be queued."""
        self._reserve(allocation_id, node_id)

    def restore_preemption(self, victim: uuid.UUID, preemptor: uuid.UUID) -> None:
        """Load an in-flight preemption (service start-up): the victim is already promised to ``preemptor``."""
        self.preempting[victim] = preemptor

    def tick(self) -> list[tuple[Request, Placement]]:
        """One full re-evaluation pass over reservations and the queue; returns what it placed.
        The service calls it periodically (aging needs time to pass) and after cancels."""
        return self._pass(None, None)

    def _pass(self, freed: uuid.UUID | None, tenant: uuid.UUID | None) -> list[tuple[Request, Placement]]:
        """Re-evaluate. After a release on node ``freed`` only two kinds of pending request can
        newly fit (full passes keep this true): those that fit on that node, and those of
        ``tenant``, whose quota use dropped. Everything else is skipped without a placement try."""
        placed = self._serve_reservations(freed)
        fits_freed = None
        if freed is not None:
            fits_freed = {k for k, r in self.queue.kinds().items() if self.inv.place_on(freed, r) is not None}
            if not fits_freed and not self.queue.pending_of(tenant):
                return placed
        no_room: set[tuple] = set()          # demand kinds that fit nowhere
        failed: set[tuple] = set()           # ... that fit nowhere within these admitted pairs
        admitted_of: dict[tuple, tuple[frozenset, bool]] = {}
        reserved_one, now = False, self.clock()
        todo = self.queue.order(self.usage) if freed is None else \
            self.queue.ranked(self.usage, fits_freed, tenant, self.max_scan)
        for n, req in enumerate(todo):
            if n >= self.max_scan:
                break
            k0 = demand_kind(req)
            if k0 in no_room:
                continue
            gang = self.gangs.get(req.allocation_id)
            if gang is not None:          # one member fitting says nothing: the gang is tried whole
                aged = not reserved_one and now - req.enqueued_at >= self.aging_s
                done, reserved = self._gang_turn(gang, aged)
                reserved_one |= reserved
                if done:
                    admitted_of = {k: v for k, v in admitted_of.items() if k[0] != req.tenant_id}
                continue
            qk = (req.tenant_id, k0)
            if qk not in admitted_of:
                admitted_of[qk] = self._admitted(req)
            admitted, everywhere = admitted_of[qk]
            if not admitted or (k0, admitted) in failed:
                continue
            p = self.inv.place(req, admit=admitted.__contains__)
            if p is not None:
                self._dequeue(req.allocation_id)
                self._grant(req, p)
                placed.append((req, p))
                admitted_of = {k: v for k, v in admitted_of.items() if k[0] != req.tenant_id}
                continue
            (no_room.add(k0) if everywhere else failed.add((k0, admitted)))
            if not reserved_one and now - req.enqueued_at >= self.aging_s:
                reserved_one = self._reserve_closest(req)
        return placed

    # ---- internals
    def _serve_reservations(self, freed: uuid.UUID | None = None) -> list[tuple[Request, Placement]]:
        """Place reservation holders that fit on their node now (only the one on ``freed``, if given)."""
        placed = []
        if freed is None:
            todo = list(self.reservations.items())
        else:
            node = self.inv.node(freed)
            aid = node.reserved_for if node is not None else None
            todo = [(aid, freed)] if aid is not None and self.reservations.get(aid) == freed else []
        for aid, nid in todo:
            req = self.queue.get(aid)
            node = self.inv.node(nid)
            if req is None or node is None or node.state.cordoned or not node.state.approved:
                self.reservations.pop(aid)
                self.inv.unreserve(nid)
                continue
            if any(by == aid for by in self.preempting.values()):
                continue                      # victims still running: wait for their release
            if aid in self.gangs:
                self._serve_gang(self.gangs[aid])
                continue
            p = self.inv.place_on(nid, req)
            if p is not None and self.quotas.check(self._key(req, p), req.shape.quota_units).ok:
                self._dequeue(aid)
                self._grant(req, p)
                placed.append((req, p))
        return placed

    def _reserve_closest(self, req: Request) -> bool:
        """Reserve for an aged request, unless a node of a partition it could use is reserved
        already (one reservation per partition, as in EASY backfill: more would idle capacity)."""
        if req.allocation_id in self.reservations or len(self.reservations) >= self.max_reservations:
            return False
        parts = self.inv.eligible(req)
        for nid in self.reservations.values():
            node = self.inv.node(nid)
            if node is not None and node.part in parts:
                return False
        nid = self.inv.closest_node(req, admit=self._admitted(req)[0].__contains__)
        if nid is None:
            return False
        self._reserve(req.allocation_id, nid)
        return True

    def _reserve(self, aid: uuid.UUID, nid: uuid.UUID) -> None:
        old = self.reservations.pop(aid, None)
        if old is not None:
            self.inv.unreserve(old)
        self.inv.reserve(nid, aid)
        self.reservations[aid] = nid

    def _dequeue(self, aid: uuid.UUID) -> None:
        self.queue.cancel(aid)
        self._drop_claims(aid)

    def _drop_claims(self, aid: uuid.UUID) -> None:
        """Forget the reservation and the victims held for a request no longer pending."""
        node = self.reservations.pop(aid, None)
        if node is not None:
            self.inv.unreserve(node)
        for victim in [v for v, by in self.preempting.items() if by == aid]:
            del self.preempting[victim]

    def _victims(self, req: Request) -> list[uuid.UUID] | None:
        if req.spot or len(self.reservations) >= self.max_reservations:
            return None
        return select_victims(self.inv, self.quotas, req, exclude=self.preempting)

    def _grant(self, req: Request, p: Placement) -> QuotaVerdict:
        self.inv.hold(req.allocation_id, req, p)
        key = self._key(req, p)
        verdict = self.quotas.check(key, req.shape.quota_units)
        self.quotas.charge(key, req.shape.quota_units)
        self._use(req.tenant_id, req.shape.quota_units)
        return verdict

    def _quota(self, req: Request) -> tuple[QuotaVerdict | None, set[tuple[str, str]]]:
        """The verdict to report and the (pool, model) pairs within quota for this request."""
        pairs = {(p.pool, p.model) for p in self.inv.eligible(req)}
        if req.pool is not None and req.shape.gpu_model is not None:
            pairs.add((req.pool, req.shape.gpu_model))
        units, t = req.shape.quota_units, req.tenant_id
        ok = {pm for pm in pairs if self.quotas.fits(QuotaKey(t, pm[1], pm[0]), units)}
        if ok:
            return None, ok
        keys = sorted((QuotaKey(t, m, pool) for pool, m in pairs),      # name an existing quota first
                      key=lambda k: (self.quotas.limit(k) is None, k.pool, k.gpu_model))
        return (self.quotas.check(keys[0], units) if keys else None), ok

    def _admitted(self, req: Request) -> tuple[frozenset, bool]:
        """(pool, model) pairs within quota for ``req``, and whether that is every eligible pair."""
        pairs = {(p.pool, p.model) for p in self.inv.eligible(req)}
        units, t = req.shape.quota_units, req.tenant_id
        ok = frozenset(pm for pm in pairs if self.quotas.fits(QuotaKey(t, pm[1], pm[0]), units))
        return ok, len(ok) == len(pairs)

    @staticmethod
    def _key(req: Request, p: Placement) -> QuotaKey:
        return QuotaKey(req.tenant_id, p.gpu_model, p.pool)

    def _use(self, tenant: uuid.UUID, delta: int) -> None:
        left = self.usage.get(tenant, 0) + delta
        if left > 0:
            self.usage[tenant] = left
        else:
            self.usage.pop(tenant, None)

    @staticmethod
    def _no_capacity(req: Request) -> str:
        return (f"no capacity: nothing free fits shape {req.shape.name} "
                f"({req.shape.gpu_count} GPU(s), pool {req.pool or 'any'}) on one node now")

    @staticmethod
    def _nowhere(req: Request) -> str:
        return (f"no pool the request may use offers shape {req.shape.name} "
                f"(pool {req.pool or 'any'}, model {req.shape.gpu_model or 'any'}, check tolerations)")
