"""A batch's reservations, or a batch's gangs, claimed together, in one round trip.

In the consumer kit's first run of a batch of several reservations (``Writes.batched``), a reserve the index
placed does not claim at once: it leaves its claim here (``BatchClaims.leave``), and just before the batch
writes, every claim left is made in one round trip (the repository's ``claim_each``: each the ordinary
conditional claim, counting its node), then each step's outcome is recorded and its ``slots_reserved`` sent, as
the reserve would have done itself. A batch of gangs the same way: a gang the index placed leaves its members'
claims (``leave_gang``), its decision already recorded and answered in the batch's transaction; all or none
still holds, as a refused member fails the whole run.

A claim the database refuses means the index was stale (another replica, or a change it missed): the first
run fails, the index is marked for a reload, and the kit runs the batch again with each reserve (or gang) alone,
which claims at once (reservations.py, gangs.py) and answers as ever. A reserve of an allocation whose claim waits here first
has the waiting claims made, so that it finds the allocation held, as it would had the claim been made at once.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from shared.unit_of_work import UnitOfWork

from ..domain.gang import GangPlacement
from ..domain.inventory import Placement, Request
from .common import LeftForBatch
from .placing import claim_of, conclude, reserved_result


class ClaimsRefused(Exception):
    """A claim left for the batch was refused: the batch runs again, each reserve claiming on its own."""


@dataclass(frozen=True)
class _Left:
    ctx: UnitOfWork
    req: Request
    placement: Placement
    data: dict[str, Any]
    answered: bool = False      # a gang's member: its gang was answered by its own handler


class BatchClaims(LeftForBatch):
    """The claims the reserves of one batch left (``_Left``), made together before it writes; ``of`` is None
    when a reserve must claim at once."""

    name = "scheduler.claims"
    left: dict[uuid.UUID, _Left]

    def leave(self, ctx: UnitOfWork, req: Request, placement: Placement, data: dict[str, Any]) -> None:
        self.left[req.allocation_id] = _Left(ctx, req, placement, data)

    def leave_gang(self, ctx: UnitOfWork, gp: GangPlacement, data: dict[str, Any]) -> None:
        """Leave every member's claim of a gang the index placed (its answer is the caller's)."""
        for req, p in gp.members():
            self.left[req.allocation_id] = _Left(ctx, req, p, data, answered=True)

    async def flush(self) -> None:
        """Make every claim left, then answer each; raise ClaimsRefused (the index marked for a reload) when
        the database refused one."""
        left, self.left = list(self.left.values()), {}
        if not left:
            return
        store = self.active.repository(self.ctx.conn)
        answers = await store.claim_each([claim_of(lf.req, lf.placement, lf.data) for lf in left])
        refused = [a for a in answers if isinstance(a, Exception)]
        if refused:
            self.active.needs_reload = True
            raise ClaimsRefused(f"{len(refused)} of {len(left)} claims refused, first: {refused[0]}")
        for lf, (details, capacity) in zip(left, answers, strict=True):
            if not lf.answered:
                await conclude(lf.ctx, lf.data, "done", reserved_result(lf.placement, details, capacity=capacity))


async def made_before(ctx: UnitOfWork, allocation_id: uuid.UUID) -> None:
    """When the batch holds a claim left for ``allocation_id``, make the claims left now (a later reserve of the
    same allocation must find it held)."""
    claims = ctx.writes.later.get(BatchClaims.name)
    if claims is not None and allocation_id in claims.left:
        await claims.flush()
