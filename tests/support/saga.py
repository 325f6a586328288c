"""A given/expect harness over the pure saga state machine, for unit tests.

    s = SagaScenario.allocate()                       # given a started allocate saga
    cmd = s.expect_command("scheduler.reserve_slots") # expect this command next
    s.fail(cmd, "no capacity")                        # reply with failure
    s.expect_command("allocation.fail")               # expect what follows

Commands are consumed in the order the saga sent them; ``advance(seconds)`` moves
the clock and feeds every passed deadline to the machine, as the coordinator's
deadline loop does. No I/O; the clock is virtual.

``step_changes()`` is the machine's full log of step transitions (``Outcome.changes``), published or
not; ``events("saga.step_changed")`` is what the coordinator would publish (``machine.restated``).
"""
from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from services.saga.domain.definitions import DEFINITIONS
from services.saga.domain.machine import compensation_key, expired, handle
from services.saga.domain.model import OPEN, Action, Command, Event, Input, Policy, Reply, Saga, Start, StepChange

T0 = datetime(2030, 1, 1, tzinfo=UTC)


class SagaScenario:
    def __init__(self, saga: Saga, policy: Policy):
        self.saga, self.policy, self.now = saga, policy, T0
        self.actions: list[Action] = []     # everything the saga did, in order
        self.unseen: list[Command] = []     # commands not yet taken by expect_command
        self.last: list[Action] = []        # actions of the latest input
        self.changes: list[StepChange] = []  # every step change, in order, published or not

    @classmethod
    def allocate(cls, policy: Policy | None = None, **input_overrides) -> SagaScenario:
        alloc, tenant = uuid.uuid4(), uuid.uuid4()
        data = {"allocation_id": str(alloc), "tenant_id": str(tenant), "shape": "vm.2gpu", "gpu_count": 2,
                "volume_gb": 50, "labels": {"team": "ml"}, "node_id": None, **input_overrides}
        return cls(Saga(uuid.uuid4(), "allocate", alloc, tenant, data), policy or Policy()).start()

    @classmethod
    def release(cls, policy: Policy | None = None, **input_overrides) -> SagaScenario:
        alloc, tenant = uuid.uuid4(), uuid.uuid4()
        data = {"allocation_id": str(alloc), "tenant_id": str(tenant), "node_id": str(uuid.uuid4()),
                "volume_gb": 50, "labels": {"team": "ml"}, **input_overrides}
        return cls(Saga(uuid.uuid4(), "release", alloc, tenant, data), policy or Policy()).start()

    @classmethod
    def reschedule(cls, policy: Policy | None = None, **input_overrides) -> SagaScenario:
        """A move of an allocation interrupted on ``from_node_id`` (what start_reschedule gives the saga)."""
        alloc, tenant = uuid.uuid4(), uuid.uuid4()
        data = {"allocation_id": str(alloc), "tenant_id": str(tenant), "shape": "vm.2gpu", "gpu_count": 2,
                "volume_gb": 50, "labels": {"team": "ml"}, "node_id": None, "from_node_id": str(uuid.uuid4()),
                "old_slots": [2, 3], "kept_ip_address": "10.0.0.7", "interrupted_at": "2029-12-31T23:59:50+00:00",
                "attempt": 1, "category": "gpu_fault", **input_overrides}
        return cls(Saga(uuid.uuid4(), "reschedule", alloc, tenant, data), policy or Policy()).start()

    # --- given / when -----------------------------------------------------------------------------

    def feed(self, message: Input) -> list[Action]:
        self.saga, self.last, changes = handle(self.saga, message, self.policy)
        self.actions += self.last
        self.changes += changes
        self.unseen += [a for a in self.last if isinstance(a, Command)]
        return self.last

    def start(self) -> SagaScenario:
        self.feed(Start(self.now))
        return self

    def reply(self, type_: str, step: str, key: str, **data) -> list[Action]:
        return self.feed(Reply(type_, step, key, data, self.now))

    def succeed(self, cmd: Command, **data) -> list[Action]:
        """Reply success to a step command (or confirm a release step)."""
        step = self._step(cmd)
        return self.reply(step.ok, step.name, cmd.data["idempotency_key"], **data)

    def fail(self, cmd: Command, reason: str) -> list[Action]:
        step = self._step(cmd)
        assert step.fail, f"{step.name} has no failure reply"
        return self.reply(step.fail, step.name, cmd.data["idempotency_key"], reason=reason)

    def undone(self, cmd: Command) -> list[Action]:
        """Confirm a compensation command."""
        step = self._step(cmd)
        assert cmd.data["idempotency_key"] == compensation_key(self.saga.id, step.name), "not a compensation"
        return self.reply(step.undone, step.name, cmd.data["idempotency_key"])

    def advance(self, seconds: float) -> list[Action]:
        """Move the clock by ``seconds``, stopping at each deadline on the way to feed it (as the
        deadline loop would, promptly), including deadlines that feeding one sets up."""
        target = self.now + timedelta(seconds=seconds)
        done: list[Action] = []
        for _ in range(10_000):
            due = [r.deadline for r in self.saga.steps.values() if r.awaiting and r.deadline <= target]
            if not due or self.saga.status not in OPEN:
                break
            self.now = max(self.now, min(due))
            for message in expired(self.saga, self.now):
                done += self.feed(message)
        else:
            raise AssertionError("deadlines keep expiring at one instant")
        self.now = target
        return done

    # --- expect -----------------------------------------------------------------------------------

    def expect_command(self, type_: str, **fields) -> Command:
        assert self.unseen, f"expected {type_}, but the saga sent no further command"
        cmd = self.unseen.pop(0)
        assert cmd.type == type_, f"expected {type_}, got {cmd.type} ({cmd.data.get('step')})"
        for k, v in fields.items():
            assert cmd.data.get(k) == v, f"{type_}.{k}: expected {v!r}, got {cmd.data.get(k)!r}"
        return cmd

    def expect_no_command(self) -> None:
        assert not self.unseen, f"unexpected commands: {[(c.type, c.data.get('step')) for c in self.unseen]}"

    def events(self, type_: str) -> list[dict]:
        return [a.data for a in self.actions if isinstance(a, Event) and a.type == type_]

    def step_changes(self) -> list[tuple[str, str, str]]:
        """Every (step, phase, status) transition so far, published as saga.step_changed or not."""
        return [(c.step, c.phase, c.status) for c in self.changes]

    def published_step_changes(self) -> list[tuple[str, str, str]]:
        """The (step, phase, status) transitions the coordinator publishes as saga.step_changed."""
        return [(e["step"], e["phase"], e["status"]) for e in self.events("saga.step_changed")]

    def _step(self, cmd: Command):
        step = DEFINITIONS[self.saga.kind].step(cmd.data["step"])
        assert step is not None, f"no step {cmd.data['step']}"
        return step
