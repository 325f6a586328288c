"""Allocation's handlers: load the aggregate (row locked), apply the command, save, and write the
events it recorded to the outbox, all in the consumer's transaction.

Plain commands (request, fail, release, preempt, interrupt) emit the recorded
events; a command that does not fit the state emits ``allocation.command_rejected``
(request, fail, release, preempt, interrupt) or is a no-op when it is stale (see the aggregate).
A request, release, preempt or interrupt that can never apply (data PostgreSQL refuses, such as a NUL
in a name) is rolled back by the consumer kit and rejected at once the same way (``refused``).
The saga steps (activate, mark_released) go through ``shared.participant.invoke``:
one effect per idempotency key, and the reply *is* the recorded event (activate from INTERRUPTED also emits
``allocation.rescheduled``, in the same unit of work and only with the step's first effect). Their effect
(``activate_step``, ``mark_released_step``) is a function of the repository and the
command, returning the reply's fields.

Every handler reaches storage through the ``AllocationRepository`` port only. Its
``repository`` keyword builds one on the unit of work's connection: the asyncpg
repository unless told otherwise (the unit tests pass an in-memory fake).
"""
from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

import asyncpg
from pydantic import BaseModel

from shared.envelope import utcnow
from shared.participant import StepRejected, invoke, over
from shared.refusals import PermanentError, Refusal, text_safe
from shared.unit_of_work import UnitOfWork

from . import contracts as c
from .adapters.metrics import RESCHEDULE_GAP
from .adapters.repository import PgAllocationRepository
from .domain import events
from .domain.errors import IllegalTransition, InvalidSpec
from .domain.model import Allocation
from .domain.policy import RESCHEDULE_LIMITS
from .domain.ports import AllocationRepository

RepositoryFactory = Callable[[asyncpg.Connection], AllocationRepository]

WIRE_EVENTS: dict[type, tuple[str, type[BaseModel]]] = {
    events.Requested: ("allocation.requested", c.AllocationRequested),
    events.Interrupted: ("allocation.interrupted", c.AllocationInterrupted),
    events.Rescheduled: ("allocation.rescheduled", c.AllocationRescheduled),
    events.ReleaseRequested: ("allocation.release_requested", c.AllocationReleaseRequested),
    events.Failed: ("allocation.failed", c.AllocationFailed),
}


async def _emit(ctx: UnitOfWork, ev: events.AllocationEvent) -> None:
    type_, model = WIRE_EVENTS[type(ev)]
    await ctx.emit(type_, model(**asdict(ev)), tenant_id=ev.tenant_id)
    if isinstance(ev, events.Rescheduled):
        async def observe(gap: float = ev.gap_s) -> None:
            RESCHEDULE_GAP.observe(gap)
        ctx.on_commit(observe)


async def _publish(ctx: UnitOfWork, alloc: Allocation) -> None:
    for ev in alloc.pull_events():
        await _emit(ctx, ev)


async def _save(ctx: UnitOfWork, allocations: AllocationRepository, alloc: Allocation) -> None:
    await allocations.save(alloc)
    await _publish(ctx, alloc)


async def _reject(ctx: UnitOfWork, allocation_id: uuid.UUID, command: str, reason: str) -> None:
    await ctx.emit("allocation.command_rejected", c.AllocationCommandRejected(
        allocation_id=allocation_id, command=command, reason=text_safe(reason, 2000)))


def refused(command: str) -> Refusal:
    """The ``on_refused`` of a plain command's subscription (``command``: its type): the handler failed for a
    reason no retry can fix and changed nothing; the command is answered ``allocation.command_rejected``."""
    async def on_refused(ctx: UnitOfWork, cmd: Any, reason: str) -> None:
        await _reject(ctx, cmd.allocation_id, command, reason)
    return on_refused


async def _load(allocations: AllocationRepository, allocation_id: uuid.UUID, command: str) -> Allocation:
    """The locked aggregate; PermanentError if it does not exist (the saga only names existing ones)."""
    alloc = await allocations.get_for_update(allocation_id)
    if alloc is None:
        raise PermanentError(f"{command}: no allocation {allocation_id}")
    return alloc


def _as_reply(alloc: Allocation, **extra) -> dict:
    """A saga step's reply fields. invoke emits the reply, so the recorded event is dropped here."""
    alloc.pull_events()
    return {"tenant_id": alloc.tenant_id, "state": alloc.state, "at": alloc.updated_at, **extra}



async def request(ctx: UnitOfWork, cmd: c.RequestAllocation, *,
                  repository: RepositoryFactory = PgAllocationRepository) -> None:
    """Create a REQUESTED allocation. Idempotent on allocation_id: an existing id is a no-op."""
    try:
        alloc = Allocation.request(cmd.allocation_id, cmd.tenant_id, cmd.user_id, cmd.name, cmd.shape,
                                   cmd.gpu_count, cmd.volume_gb, cmd.labels, utcnow(),
                                   options=cmd.model_dump(include=set(c.Scheduling.model_fields)))
    except InvalidSpec as exc:
        await _reject(ctx, cmd.allocation_id, "allocation.request", str(exc))
        return
    if await repository(ctx.conn).add(alloc):
        await _publish(ctx, alloc)


async def fail(ctx: UnitOfWork, cmd: c.FailAllocation, *,
               repository: RepositoryFactory = PgAllocationRepository) -> None:
    """→ FAILED with step and reason; no-op if FAILED already; rejected (no change) if RELEASED."""
    allocations = repository(ctx.conn)
    alloc = await _load(allocations, cmd.allocation_id, "allocation.fail")
    try:
        alloc.fail(cmd.failed_step, cmd.reason, utcnow())
    except IllegalTransition as exc:
        await _reject(ctx, alloc.id, "allocation.fail", str(exc))
        return
    await _save(ctx, allocations, alloc)


async def _tenants(ctx: UnitOfWork, allocations: AllocationRepository,
                   cmd: c.ReleaseAllocation | c.PreemptAllocation | c.InterruptAllocation, command: str) -> Allocation | None:
    """The locked aggregate if it is the command's tenant's; otherwise the command is rejected (None)."""
    alloc = await allocations.get_for_update(cmd.allocation_id)
    if alloc is None or alloc.tenant_id != cmd.tenant_id:
        await _reject(ctx, cmd.allocation_id, command, f"tenant {cmd.tenant_id} has no allocation {cmd.allocation_id}")
        return None
    return alloc


async def release(ctx: UnitOfWork, cmd: c.ReleaseAllocation, *,
                  repository: RepositoryFactory = PgAllocationRepository) -> None:
    """ACTIVE (or REQUESTED, withdrawn by the saga coordinator: ``cmd.withdrawn``) → RELEASING; no-op if
    RELEASING/RELEASED; kept for later while INTERRUPTED (done once the reschedule activates it); otherwise rejected
    with the reason."""
    allocations = repository(ctx.conn)
    if (alloc := await _tenants(ctx, allocations, cmd, "allocation.release")) is None:
        return
    try:
        alloc.release(cmd.requested_by, utcnow(), withdrawn=cmd.withdrawn)
    except IllegalTransition as exc:
        await _reject(ctx, alloc.id, "allocation.release",
                      f"{exc} (only an ACTIVE allocation can be released; a REQUESTED one is withdrawn through its saga)")
        return
    await _save(ctx, allocations, alloc)


async def preempt(ctx: UnitOfWork, cmd: c.PreemptAllocation, *,
                  repository: RepositoryFactory = PgAllocationRepository) -> None:
    """The scheduler preempts: ACTIVE → RELEASING with the reason (the release saga follows); a no-op when it is
    releasing, released or failed already; rejected with the reason before it is ACTIVE."""
    allocations = repository(ctx.conn)
    if (alloc := await _tenants(ctx, allocations, cmd, "allocation.preempt")) is None:
        return
    try:
        changed = alloc.preempt(f"preempted: {cmd.reason}", utcnow())
    except IllegalTransition as exc:
        await _reject(ctx, alloc.id, "allocation.preempt", str(exc))
        return
    if changed:
        await _save(ctx, allocations, alloc)


async def interrupt(ctx: UnitOfWork, cmd: c.InterruptAllocation, *,
                    repository: RepositoryFactory = PgAllocationRepository,
                    limits: Mapping[str, int] = RESCHEDULE_LIMITS) -> None:
    """The scheduler reports the allocation's node failed: ACTIVE on that node → INTERRUPTED (emits
    allocation.interrupted, the reschedule saga follows), or → FAILED when ``limits`` (the retry policy) allow no
    more reschedules (emits allocation.failed, failed step "reschedule"). A no-op when it is INTERRUPTED for that
    node already, releasing, released or failed, or on another node (stale); rejected before it is ACTIVE."""
    allocations = repository(ctx.conn)
    if (alloc := await _tenants(ctx, allocations, cmd, "allocation.interrupt")) is None:
        return
    try:
        changed = alloc.interrupt(cmd.node_id, cmd.category, cmd.reason, _aware(cmd.interrupted_at), cmd.next,
                                  utcnow(), limits)
    except IllegalTransition as exc:
        await _reject(ctx, alloc.id, "allocation.interrupt", f"{exc} (only an ACTIVE allocation can be interrupted)")
        return
    if changed:
        await _save(ctx, allocations, alloc)


def _aware(t: datetime) -> datetime:
    """A wire time without a zone is UTC (the kit writes every time with one; a hand-made command may not)."""
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


Publish = Callable[[events.AllocationEvent], Awaitable[object]]


async def activate_step(allocations: AllocationRepository, cmd: c.ActivateAllocation, *,
                        publish: Publish | None = None) -> dict:
    """The activate step's effect: → ACTIVE on the command's node; returns the reply's fields. Raises StepRejected
    (nothing changes) when the allocation does not exist or its state forbids it. From INTERRUPTED the
    aggregate also records Rescheduled: ``publish`` gets it once the allocation is saved (nothing is raised
    after it, so it never outlives a rejected step)."""
    alloc = await allocations.get_for_update(cmd.allocation_id)
    if alloc is None:
        raise StepRejected(f"no allocation {cmd.allocation_id}")
    instance = cmd.instance.model_dump(mode="json") if cmd.instance else None
    try:
        alloc.activate(cmd.node_id, utcnow(), instance)
    except IllegalTransition as exc:
        raise StepRejected(str(exc)) from None
    await allocations.save(alloc)
    for ev in alloc.pull_events():   # Activated is the step's reply; a move's follow-ups are published with it
        if publish is not None and isinstance(ev, (events.Rescheduled, events.ReleaseRequested)):
            await publish(ev)
    return _as_reply(alloc, node_id=alloc.node_id, instance=instance, **_metered_by(alloc, cmd))


def _metered_by(alloc: Allocation, cmd: c.ActivateAllocation) -> dict:
    """What billing meters an active allocation by (the activated event's fields): its spec, user, spot and quoted
    price, and where the slots were reserved (the command's)."""
    return {"shape": alloc.shape, "gpu_count": alloc.gpu_count, "user_id": alloc.user_id,
            "gpu_model": cmd.gpu_model, "pool": cmd.pool, "spot": bool(alloc.options.get("spot")),
            "price": alloc.options.get("price")}


async def mark_released_step(allocations: AllocationRepository, cmd: c.MarkReleased) -> dict:
    """The mark_released step's effect: RELEASING → RELEASED; returns the reply's fields. Raises PermanentError
    (nothing changes; ``invoke`` answers the step failed) when the allocation does not exist or is in any
    other state."""
    alloc = await _load(allocations, cmd.allocation_id, "allocation.mark_released")
    try:
        alloc.mark_released(utcnow())
    except IllegalTransition as exc:
        raise PermanentError(str(exc)) from None
    await allocations.save(alloc)
    return _as_reply(alloc)


async def activate(ctx: UnitOfWork, cmd: c.ActivateAllocation, *, sim_faults: bool = False,
                   repository: RepositoryFactory = PgAllocationRepository) -> None:
    """Saga step: → ACTIVE on the node; replies activated, or activation_failed if the state forbids it. An
    INTERRUPTED allocation's activation (the reschedule saga's last step) also emits allocation.rescheduled."""
    async def step(allocations: AllocationRepository, command: c.ActivateAllocation) -> dict:
        return await activate_step(allocations, command, publish=lambda ev: _emit(ctx, ev))
    await invoke(ctx, cmd, over(repository, step), step=c.ACTIVATE, sim_faults=sim_faults, optimistic=True)


async def mark_released(ctx: UnitOfWork, cmd: c.MarkReleased, *, sim_faults: bool = False,
                        repository: RepositoryFactory = PgAllocationRepository) -> None:
    """Saga step: RELEASING → RELEASED, replies released; from any other state it changes nothing and
    replies release_failed (a PermanentError, which no retry fixes)."""
    await invoke(ctx, cmd, over(repository, mark_released_step), step=c.MARK_RELEASED, sim_faults=sim_faults,
                 optimistic=True)
