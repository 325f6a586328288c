"""The Allocation aggregate: a tenant's GPU allocation and its life cycle (pure, no I/O).

    REQUESTED → ACTIVE → RELEASING → RELEASED
    REQUESTED → RELEASING         (withdrawn before its allocate saga started: the release saga only marks it)
    ACTIVE → INTERRUPTED          (its node failed: a reschedule saga places it again, same id)
    INTERRUPTED → ACTIVE          (activate, on the new node: the reschedule succeeded)
    INTERRUPTED: a release waits  (the reschedule owns it until it ends: once ACTIVE again it goes RELEASING at
                                   once; a failed reschedule ends FAILED, which holds nothing either way)
    any non-terminal state → FAILED (with the failed step and the reason; from INTERRUPTED: the reschedule
                                     failed, or from ACTIVE at an interruption the retry policy gives up on)

REQUESTED lasts while the allocate saga runs: the allocation is told nothing until the saga activates it (a
notice at the saga's start would cost two messages per allocation). So a REQUESTED allocation takes no release but
a withdrawal's (``release(..., withdrawn=True)``, sent by the saga coordinator only when no allocate saga ran nor
will run): any other might race with a running allocate saga, and is refused.

Each command method either changes the state and records one event, does
nothing (the command is a duplicate or arrives after a later one: the result it
asks for already holds), or raises ``IllegalTransition``. The aggregate never
publishes: the handler drains ``pull_events()`` into the outbox in the same
transaction as the save.
"""
from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from services.scheduler.contracts import SHAPES

from . import events
from .errors import IllegalTransition, InvalidSpec
from .policy import RESCHEDULE_LIMITS, limit_reason, may_reschedule

REQUESTED, ACTIVE = "REQUESTED", "ACTIVE"
RELEASING, RELEASED, FAILED = "RELEASING", "RELEASED", "FAILED"
INTERRUPTED = "INTERRUPTED"

TRANSITIONS: dict[str, frozenset[str]] = {
    REQUESTED: frozenset({ACTIVE, RELEASING, FAILED}),
    ACTIVE: frozenset({RELEASING, INTERRUPTED, FAILED}),
    INTERRUPTED: frozenset({ACTIVE, FAILED}),
    RELEASING: frozenset({RELEASED, FAILED}),
    RELEASED: frozenset(),
    FAILED: frozenset(),
}


def check_spec(shape: str, gpu_count: int, shapes: Mapping[str, int] = SHAPES) -> None:
    """Raise InvalidSpec for an inconsistent spec: an empty shape name, a GPU count outside 1–16, or one of the
    built-in shapes with another GPU count. Shapes are the provider's (the scheduler owns them and refuses
    unknown ones at reservation), so a name this service has not seen is not an error here."""
    if not shape or not 1 <= gpu_count <= 16:
        raise InvalidSpec(f"shape {shape!r} with {gpu_count} GPU(s): a shape name and 1–16 GPUs are needed")
    if shape in shapes and shapes[shape] != gpu_count:
        raise InvalidSpec(f"shape {shape} has {shapes[shape]} GPU(s), the request asks for {gpu_count}")


@dataclass
class Allocation:
    id: uuid.UUID
    tenant_id: uuid.UUID
    user_id: uuid.UUID
    name: str
    shape: str
    gpu_count: int
    volume_gb: int
    labels: dict[str, str]
    state: str
    created_at: datetime
    updated_at: datetime
    node_id: uuid.UUID | None = None
    failed_step: str | None = None
    reason: str | None = None
    options: dict = field(default_factory=dict)   # scheduling/network options, see contracts.Scheduling
    interrupted_at: datetime | None = None        # the last interruption: when the tenant lost it,
    interrupt_category: str | None = None         # its category (policy.Category),
    reschedules: int = 0                          # and how many reschedules it has started, all told
    release_pending_by: uuid.UUID | None = None   # a release asked while INTERRUPTED (by whom), done once ACTIVE
    release_pending: bool = False
    _events: list[events.AllocationEvent] = field(default_factory=list, repr=False, compare=False)

    @classmethod
    def request(cls, id: uuid.UUID, tenant_id: uuid.UUID, user_id: uuid.UUID, name: str, shape: str,
                gpu_count: int, volume_gb: int, labels: Mapping[str, str], at: datetime,
                options: Mapping | None = None) -> Allocation:
        """A new REQUESTED allocation, recording Requested. Raises InvalidSpec for an inconsistent spec.
        ``options`` are the scheduling/network options (priority, spot, pool, tolerations, fail_fast, network_id)."""
        check_spec(shape, gpu_count)
        opts = dict(options or {})
        alloc = cls(id, tenant_id, user_id, name, shape, gpu_count, volume_gb, dict(labels), REQUESTED, at, at,
                    options=opts)
        alloc._record(events.Requested, user_id=user_id, name=name, shape=shape, gpu_count=gpu_count,
                      volume_gb=volume_gb, labels=dict(labels), **opts)
        return alloc

    def pull_events(self) -> list[events.AllocationEvent]:
        """The events recorded since the last pull (and forget them)."""
        out, self._events = self._events, []
        return out

    def activate(self, node_id: uuid.UUID, at: datetime, instance: Mapping | None = None) -> None:
        """REQUESTED → ACTIVE on ``node_id``, recording Activated; INTERRUPTED → ACTIVE on the
        node it was rescheduled to, recording Activated then Rescheduled (from the node it lost, and the gap
        since it lost it); no-op if already ACTIVE on that node.

        Raises IllegalTransition otherwise (e.g. FAILED, or ACTIVE on another node)."""
        if self.state == ACTIVE and self.node_id == node_id:
            return
        rescheduled_from = self.node_id if self.state == INTERRUPTED else None
        self._move(ACTIVE, "activate", at)
        self.node_id = node_id
        doc = dict(instance) if instance is not None else None
        self._record(events.Activated, node_id=node_id, instance=doc)
        if rescheduled_from is not None:
            lost = self.interrupted_at or at
            self._record(events.Rescheduled, from_node_id=rescheduled_from, to_node_id=node_id, interrupted_at=lost,
                         gap_s=max(0.0, (at - lost).total_seconds()), attempt=self.reschedules,
                         instance=doc)
            if self.release_pending:   # the tenant asked while it moved: released now that it is placed
                self.release_pending = False
                self.release(self.release_pending_by, at)

    def interrupt(self, node_id: uuid.UUID, category: str, reason: str, interrupted_at: datetime, next: str,
                  at: datetime, limits: Mapping[str, int] = RESCHEDULE_LIMITS) -> bool:
        """Its node ``node_id`` failed at ``interrupted_at`` (kept no later than ``at``). ACTIVE on that node →
        INTERRUPTED, recording Interrupted (the reschedule's attempt number); or, when the retry policy gives up
        on one more reschedule, → FAILED (failed step "reschedule"), recording Failed. Returns False (no-op) when
        it is INTERRUPTED for that node already, releasing, released or failed, or on another node (the
        interruption is stale: it moved already). Raises IllegalTransition before it is ACTIVE."""
        if self.state == REQUESTED:
            raise IllegalTransition(self.id, self.state, INTERRUPTED, "interrupt")
        if self.state != ACTIVE or self.node_id != node_id:
            return False
        self.interrupted_at, self.interrupt_category = min(interrupted_at, at), category
        if not may_reschedule(category, self.reschedules, limits):
            self.fail("reschedule", f"{limit_reason(category, self.reschedules, limits)} ({reason})", at)
            return True
        self._move(INTERRUPTED, "interrupt", at)
        self.reschedules += 1
        opts = {k: v for k, v in self.options.items() if k in events.SCHEDULING_OPTIONS}
        self._record(events.Interrupted, node_id=node_id, category=category, reason=reason,
                     interrupted_at=self.interrupted_at, next=next, attempt=self.reschedules, user_id=self.user_id,
                     shape=self.shape, gpu_count=self.gpu_count, volume_gb=self.volume_gb, labels=dict(self.labels),
                     **opts)
        return True

    def fail(self, failed_step: str, reason: str, at: datetime) -> None:
        """Any non-terminal state → FAILED; no-op if already FAILED. Raises IllegalTransition from RELEASED."""
        if self.state == FAILED:
            return
        self._move(FAILED, "fail", at)
        self.failed_step, self.reason = failed_step, reason
        self._record(events.Failed, failed_step=failed_step, reason=reason)

    def release(self, requested_by: uuid.UUID | None, at: datetime, *, withdrawn: bool = False) -> None:
        """ACTIVE → RELEASING; no-op if RELEASING or RELEASED already. Raises IllegalTransition otherwise.
        INTERRUPTED: nothing changes now, the release is kept and done when the reschedule activates it (a
        command the gateway accepted never dies silently; a reschedule that fails leaves it FAILED, holding
        nothing).

        Also REQUESTED → RELEASING, ``withdrawn`` only: the saga coordinator's, for an allocation it withdrew
        before its allocate saga started (none ran, none will). Without it a REQUESTED allocation's release is
        refused: its allocate saga may be running (the gateway withdraws such an allocation through the
        coordinator, which keeps the release until the saga ends)."""
        if self.state in (RELEASING, RELEASED):
            return
        if self.state == INTERRUPTED:   # the reschedule owns it: the release waits until it is ACTIVE again
            self.release_pending, self.release_pending_by = True, requested_by
            return
        if self.state == REQUESTED and not withdrawn:
            raise IllegalTransition(self.id, self.state, RELEASING, "release (its allocate saga may be running)")
        self._move(RELEASING, "release", at)
        self._record(events.ReleaseRequested, requested_by=requested_by, node_id=self.node_id,
                     volume_gb=self.volume_gb, labels=dict(self.labels))

    def preempt(self, reason: str, at: datetime) -> bool:
        """ACTIVE → RELEASING because the scheduler preempts it; the reason is recorded. Returns False (no-op) when
        it is releasing, released or failed already. Raises IllegalTransition before it is ACTIVE."""
        if self.state in (RELEASING, RELEASED, FAILED):
            return False
        if self.state != ACTIVE:   # only what runs is preempted (REQUESTED → RELEASING is a withdrawal's)
            raise IllegalTransition(self.id, self.state, RELEASING, "preempt")
        self._move(RELEASING, "preempt", at)
        self.reason = reason
        self._record(events.ReleaseRequested, requested_by=None, node_id=self.node_id, volume_gb=self.volume_gb,
                     labels=dict(self.labels), reason=reason)
        return True

    def mark_released(self, at: datetime) -> None:
        """RELEASING → RELEASED; no-op if RELEASED already. Raises IllegalTransition otherwise."""
        if self.state == RELEASED:
            return
        self._move(RELEASED, "mark released", at)
        self._record(events.Released)

    def _move(self, target: str, command: str, at: datetime) -> None:
        if target not in TRANSITIONS[self.state]:
            raise IllegalTransition(self.id, self.state, target, command)
        self.state = target
        self.updated_at = max(at, self.updated_at)

    def _record(self, kind: type[events.AllocationEvent], **fields) -> None:
        self._events.append(kind(allocation_id=self.id, tenant_id=self.tenant_id, state=self.state,
                                 at=self.updated_at, **fields))
