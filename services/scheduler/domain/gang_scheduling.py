"""The scheduler's side of gangs (pure): decide a gang, let it wait as one entry, place it whole later.

Mixed into ``Scheduler`` (scheduler.py), whose state it shares: a waiting gang is one request in the
fair queue (its ``template``, keyed by the gang id: one entry against the tenant's bound) and an entry
of ``gangs``; the scheduler's passes call ``_gang_turn`` when they meet it, and the reservation pass
``_serve_gang`` for an aged gang's node. What a pass places whole is appended to ``placed_gangs``, which
the caller drains (``take_placed_gangs``) to claim and answer it: the passes' own return value stays
the single requests they placed.
"""
from __future__ import annotations

import uuid
from dataclasses import replace
from typing import TYPE_CHECKING

from .gang import Gang, GangDecision, GangPlacement, plan, score
from .queue import QueueFull
from .quota import QuotaKey

if TYPE_CHECKING:
    from .scheduler import Scheduler


class GangScheduling:
    def _gang_state(self: Scheduler) -> None:
        self.gangs: dict[uuid.UUID, Gang] = {}                 # waiting gangs by gang id
        self.placed_gangs: list[GangPlacement] = []

    def submit_gang(self: Scheduler, gang: Gang) -> GangDecision:
        """Decide a gang: placed whole (every member held, quota charged), queued (holding nothing), or
        rejected (over quota for N x units, nowhere to go, fail fast, queue full). Idempotent: a waiting
        gang answers queued, a gang whose members all hold answers placed with their placements."""
        if gang.gang_id in self.gangs:
            return GangDecision("queued", reason="already pending")
        held = [self.inv.holding(m) for m in gang.members]
        if all(held):
            return GangDecision("placed", score(self.inv, gang, [h[1] for h in held]), "already placed")
        if any(held) or any(m in self.queue for m in gang.members):
            return GangDecision("rejected", reason="a member already holds slots or waits on its own",
                                code="invalid-request")
        verdict, admitted = self._gang_quota(gang)
        if not admitted:
            if verdict is None:
                return GangDecision("rejected", reason=self._nowhere(gang.template), code="no-capacity")
            return GangDecision("rejected", reason=verdict.reason, code="quota-exceeded", quota_verdict=verdict)
        if gang.template.enqueued_at == 0.0:
            gang = replace(gang, template=replace(gang.template, enqueued_at=self.clock()))
        gp = plan(self.inv, gang, admitted.__contains__, keep=True)   # held: granting it adds the quota
        if gp is not None:
            self._grant_gang(gp)
            return GangDecision("placed", gp, "placed")
        if gang.template.fail_fast:
            return GangDecision("rejected", reason=self._no_room(gang), code="no-capacity")
        try:
            self.queue.push(gang.template)
        except QueueFull as exc:
            return GangDecision("rejected", reason=str(exc), code="queue-full")
        self.gangs[gang.gang_id] = gang
        return GangDecision("queued", reason=self._no_room(gang))

    def cancel_gang(self: Scheduler, gang_id: uuid.UUID) -> Gang | None:
        """Withdraw a waiting gang (and its reservation); None if it was not waiting. Call ``tick`` after."""
        gang = self.gangs.pop(gang_id, None)
        if gang is not None:
            self._drop_claims(gang_id)
            self.queue.cancel(gang_id)
        return gang

    def restore_gang(self: Scheduler, gang: Gang) -> None:
        """Load a waiting gang (service start-up); raises QueueFull when the tenant's bound is reached."""
        self.queue.push(gang.template)
        self.gangs[gang.gang_id] = gang

    def take_placed_gangs(self: Scheduler) -> list[GangPlacement]:
        """The gangs the passes placed since the last call (already held), for the caller to claim."""
        out, self.placed_gangs = self.placed_gangs, []
        return out

    def unplace_gang(self: Scheduler, gp: GangPlacement) -> None:
        """Undo a gang placement the database refused (every member), without re-running the queue."""
        for m in gp.gang.members:
            self.unplace(m)

    # ---- the passes' hooks
    def _gang_turn(self: Scheduler, gang: Gang, aged: bool) -> tuple[bool, bool]:
        """Try a waiting gang whole in a pass: (placed, reserved a node for it)."""
        gp = self._try_gang(gang)
        if gp is not None:
            return True, False
        if aged and gang.gang_id not in self.reservations:
            return False, self._reserve_closest(gang.template)
        return False, False

    def _serve_gang(self: Scheduler, gang: Gang) -> bool:
        """The reservation pass met an aged gang's node: try the gang whole (its node included)."""
        return self._try_gang(gang) is not None

    def _try_gang(self: Scheduler, gang: Gang) -> GangPlacement | None:
        if any(self.inv.holding(m) is not None or m in self.queue for m in gang.members):
            return None      # a member reserved on its own meanwhile: the gang cannot be placed whole as asked
        admitted = self._gang_quota(gang)[1]
        if not admitted:
            return None
        own = self.reservations.get(gang.gang_id)
        if own is not None:
            self.inv.unreserve(own)            # its own reserved node is usable by it
        gp = plan(self.inv, gang, admitted.__contains__, keep=True)   # held: granting it adds the quota
        if gp is None:
            if own is not None:
                self.inv.reserve(own, gang.gang_id)
            return None
        self.gangs.pop(gang.gang_id, None)
        self._dequeue(gang.gang_id)
        self._grant_gang(gp)
        self.placed_gangs.append(gp)
        return gp

    # ---- internals
    def _grant_gang(self: Scheduler, gp: GangPlacement) -> None:
        for req, p in gp.members():
            self._grant(req, p)

    def _gang_quota(self: Scheduler, gang: Gang):
        """(the verdict to report, the (pool, model) pairs whose quota holds the whole gang)."""
        req = gang.template
        pairs = {(p.pool, p.model) for p in self.inv.eligible(req)}
        if req.pool is not None and req.shape.gpu_model is not None:
            pairs.add((req.pool, req.shape.gpu_model))
        t = req.tenant_id
        ok = {pm for pm in pairs if self.quotas.fits(QuotaKey(t, pm[1], pm[0]), gang.units)}
        if ok:
            return None, ok
        keys = sorted((QuotaKey(t, m, pool) for pool, m in pairs),
                      key=lambda k: (self.quotas.limit(k) is None, k.pool, k.gpu_model))
        return (self.quotas.check(keys[0], gang.units) if keys else None), ok

    @staticmethod
    def _no_room(gang: Gang) -> str:
        s = gang.template.shape
        return (f"no capacity: {len(gang.members)} x shape {s.name} ({s.gpu_count} GPU(s) each, pool "
                f"{gang.template.pool or 'any'}) do not all fit now; the gang waits whole, holding nothing")
