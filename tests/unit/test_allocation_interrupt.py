"""An allocation whose node fails: interrupt (ACTIVE → INTERRUPTED, or FAILED past the retry policy's bound), the
reschedule's activate (INTERRUPTED → ACTIVE, with allocation.rescheduled), and what INTERRUPTED refuses. Over an
in-memory repository and a recording unit of work (no I/O)."""
from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from services.allocation import contracts as c
from services.allocation import handlers
from services.allocation.domain import events
from services.allocation.domain.model import (
    ACTIVE,
    FAILED,
    INTERRUPTED,
    RELEASED,
    RELEASING,
    REQUESTED,
    Allocation,
)
from services.allocation.domain.policy import RESCHEDULE_LIMITS, may_reschedule
from shared.participant import StepRejected
from shared.wire import step_key
from tests.support.fakes import FakeAllocationRepository, FakeUnitOfWork, factory

T0 = datetime(2030, 1, 1, tzinfo=UTC)
TENANT, NODE, NEW_NODE = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
OPTIONS = {"priority": 5, "spot": True, "pool": "west", "tolerations": ["gpu-flaky"], "fail_fast": False,
           "network_id": str(uuid.uuid4()), "guest": None, "volumes": [], "scratch_class": None, "price": None}


def allocation(state: str = ACTIVE) -> Allocation:
    """A stored allocation brought to ``state`` by the aggregate's own commands (on NODE once activated)."""
    a = Allocation.request(uuid.uuid4(), TENANT, uuid.uuid4(), "train-1", "vm.2gpu", 2, 50, {"team": "ml"}, T0,
                           options=OPTIONS)
    if state in (ACTIVE, INTERRUPTED, RELEASING, RELEASED):
        a.activate(NODE, T0)
    if state == INTERRUPTED:
        a.interrupt(NODE, "node_lost", "heartbeats stopped", T0, "rescheduling", T0)
    if state in (RELEASING, RELEASED):
        a.release(uuid.uuid4(), T0)
    if state == RELEASED:
        a.mark_released(T0)
    if state == FAILED:
        a.fail("reserve_slots", "no capacity", T0)
    a.pull_events()
    return a


def interrupt_cmd(a: Allocation, *, node: uuid.UUID = NODE, category: str = "node_lost",
                  lost: datetime | None = None) -> c.InterruptAllocation:
    return c.InterruptAllocation(allocation_id=a.id, tenant_id=a.tenant_id, node_id=node, category=category,
                                 reason="node n1 stopped answering heartbeats",
                                 interrupted_at=lost or datetime.now(UTC) - timedelta(seconds=30),
                                 next="it is being placed on another node; its volumes come along")


async def interrupt(repo: FakeAllocationRepository, cmd: c.InterruptAllocation, **kw) -> FakeUnitOfWork:
    uow = FakeUnitOfWork("allocation", "allocation.interrupt", cmd)
    await handlers.interrupt(uow, cmd, repository=factory(repo), **kw)
    return uow


def activate_cmd(a: Allocation, node: uuid.UUID = NEW_NODE) -> c.ActivateAllocation:
    saga = uuid.uuid4()
    return c.ActivateAllocation(saga_id=saga, step="activate", idempotency_key=step_key(saga, "activate"),
                                allocation_id=a.id, tenant_id=a.tenant_id, node_id=node)


# --- interrupt -------------------------------------------------------------------------------------------------
async def test_interrupt_moves_an_active_allocation_to_interrupted_and_tells_the_tenant_and_the_reschedule():
    a = allocation(ACTIVE)
    repo, cmd = FakeAllocationRepository(a), interrupt_cmd(a)
    uow = await interrupt(repo, cmd)
    row = repo.rows[a.id]
    assert (row.state, row.node_id, row.interrupted_at, row.interrupt_category, row.reschedules) == (
        INTERRUPTED, NODE, cmd.interrupted_at, "node_lost", 1)
    env = uow.only("allocation.interrupted")
    assert env.tenant_id == TENANT
    sent = c.AllocationInterrupted.model_validate(env.data)
    assert (sent.state, sent.node_id, sent.category, sent.reason, sent.next, sent.attempt, sent.interrupted_at) == (
        INTERRUPTED, NODE, "node_lost", cmd.reason, cmd.next, 1, cmd.interrupted_at)
    # all a reschedule needs to place it again, as allocation.requested carried it
    assert (sent.user_id, sent.shape, sent.gpu_count, sent.volume_gb, sent.labels) == (
        a.user_id, "vm.2gpu", 2, 50, {"team": "ml"})
    assert (sent.priority, sent.spot, sent.pool, sent.tolerations, str(sent.network_id)) == (
        5, True, "west", ["gpu-flaky"], OPTIONS["network_id"])


async def test_an_interruption_dated_in_the_future_is_kept_at_the_time_it_was_handled():
    a = allocation(ACTIVE)
    repo = FakeAllocationRepository(a)
    cmd = interrupt_cmd(a, lost=datetime.now(UTC) + timedelta(hours=1))
    await interrupt(repo, cmd)
    assert repo.rows[a.id].interrupted_at <= datetime.now(UTC)


@pytest.mark.parametrize("state", [RELEASING, RELEASED, FAILED, INTERRUPTED])
async def test_interrupting_an_allocation_that_is_interrupted_releasing_released_or_failed_is_a_no_op(state):
    a = allocation(state)
    repo = FakeAllocationRepository(a)
    uow = await interrupt(repo, interrupt_cmd(a))
    assert uow.types() == [] and repo.rows[a.id].state == state and repo.rows[a.id].reschedules == a.reschedules


@pytest.mark.parametrize("state", [ACTIVE, INTERRUPTED])
async def test_an_interrupt_for_another_node_than_the_allocations_is_stale_and_a_no_op(state):
    a = allocation(state)
    repo = FakeAllocationRepository(a)
    uow = await interrupt(repo, interrupt_cmd(a, node=uuid.uuid4()))
    assert uow.types() == [] and (repo.rows[a.id].state, repo.rows[a.id].node_id) == (state, NODE)


async def test_interrupting_an_allocation_before_it_is_active_is_rejected_and_changes_nothing():
    state = REQUESTED
    a = allocation(state)
    repo = FakeAllocationRepository(a)
    uow = await interrupt(repo, interrupt_cmd(a))
    assert f"it is {state}" in uow.only("allocation.command_rejected").data["reason"]
    assert repo.rows[a.id].state == state


async def test_an_interrupt_of_another_tenants_or_an_unknown_allocation_is_rejected():
    a = allocation(ACTIVE)
    repo = FakeAllocationRepository(a)
    uow = await interrupt(repo, interrupt_cmd(a).model_copy(update={"tenant_id": uuid.uuid4()}))
    assert uow.only("allocation.command_rejected").data["command"] == "allocation.interrupt"
    uow = await interrupt(repo, interrupt_cmd(a).model_copy(update={"allocation_id": uuid.uuid4()}))
    assert uow.only("allocation.command_rejected").data["command"] == "allocation.interrupt"
    assert repo.rows[a.id].state == ACTIVE


# --- the retry policy ------------------------------------------------------------------------------------------
def test_the_policy_bounds_reschedules_per_category_and_never_reschedules_an_unknown_one():
    assert [may_reschedule("node_lost", n) for n in range(4)] == [True, True, True, False]
    assert may_reschedule("drain", 9) and not may_reschedule("drain", 10)
    assert not may_reschedule("cosmic_ray", 0)
    assert set(RESCHEDULE_LIMITS) == {"node_lost", "gpu_fault", "drain", "maintenance"}


async def test_an_interrupt_past_the_categorys_bound_fails_the_allocation_naming_the_category_and_count():
    a = allocation(ACTIVE)
    a.reschedules = 3
    repo = FakeAllocationRepository(a)
    uow = await interrupt(repo, interrupt_cmd(a, category="gpu_fault"))
    row = repo.rows[a.id]
    assert (row.state, row.failed_step, row.reschedules, row.interrupt_category) == (FAILED, "reschedule", 3,
                                                                                      "gpu_fault")
    failed = uow.only("allocation.failed").data
    assert failed["failed_step"] == "reschedule" and "gpu_fault" in failed["reason"] and "3" in failed["reason"]


async def test_the_handler_takes_the_bounds_it_is_given():
    a = allocation(ACTIVE)
    repo = FakeAllocationRepository(a)
    uow = await interrupt(repo, interrupt_cmd(a, category="drain"), limits={"drain": 0})
    assert uow.types() == ["allocation.failed"]


async def test_each_reschedule_counts_and_the_attempt_numbers_follow():
    a = Allocation.request(uuid.uuid4(), TENANT, uuid.uuid4(), "t", "vm.2gpu", 2, 0, {}, T0)
    nodes = [uuid.uuid4() for _ in range(4)]
    a.activate(nodes[0], T0)
    attempts = []
    for i in range(3):
        a.interrupt(nodes[i], "node_lost", "lost", T0, "next", T0)
        attempts += [e.attempt for e in a.pull_events() if isinstance(e, events.Interrupted)]
        a.activate(nodes[i + 1], T0)
    a.pull_events()
    a.interrupt(nodes[3], "node_lost", "lost", T0, "next", T0)
    assert attempts == [1, 2, 3] and a.state == FAILED and a.reschedules == 3


# --- activate from INTERRUPTED (the reschedule's last step) ----------------------------------------------------
async def test_activate_from_interrupted_moves_it_to_the_new_node_and_publishes_rescheduled_with_the_gap():
    a = allocation(ACTIVE)
    repo = FakeAllocationRepository(a)
    lost = datetime.now(UTC) - timedelta(seconds=90)
    await interrupt(repo, interrupt_cmd(a, lost=lost))
    published: list[events.AllocationEvent] = []

    async def publish(ev):
        published.append(ev)
    reply = await handlers.activate_step(repo, activate_cmd(a), publish=publish)
    assert (repo.rows[a.id].state, repo.rows[a.id].node_id) == (ACTIVE, NEW_NODE)
    assert (reply["state"], reply["node_id"]) == (ACTIVE, NEW_NODE)
    [ev] = published
    sent = c.AllocationRescheduled(**{k: v for k, v in vars(ev).items()})
    assert (sent.state, sent.from_node_id, sent.to_node_id, sent.interrupted_at, sent.attempt) == (
        ACTIVE, NODE, NEW_NODE, lost, 1)
    assert 90 <= sent.gap_s < 120
    assert repo.rows[a.id].interrupted_at == lost   # the facts stay for the tenant's view


async def test_activate_of_a_new_allocation_publishes_no_rescheduled():
    a = allocation(REQUESTED)
    repo, published = FakeAllocationRepository(a), []

    async def publish(ev):
        published.append(ev)
    await handlers.activate_step(repo, activate_cmd(a), publish=publish)
    assert published == [] and repo.rows[a.id].state == ACTIVE


async def test_a_failed_reschedule_fails_the_interrupted_allocation():
    a = allocation(INTERRUPTED)
    repo = FakeAllocationRepository(a)
    cmd = c.FailAllocation(allocation_id=a.id, saga_id=uuid.uuid4(), failed_step="reserve_slots",
                           reason="no node has room")
    uow = FakeUnitOfWork("allocation", "allocation.fail", cmd)
    await handlers.fail(uow, cmd, repository=factory(repo))
    assert repo.rows[a.id].state == FAILED and uow.types() == ["allocation.failed"]
    with pytest.raises(StepRejected, match="it is FAILED"):
        await handlers.activate_step(repo, activate_cmd(a))


# --- a release asked while INTERRUPTED ------------------------------------------------------------------------
async def test_a_release_asked_while_the_allocation_moves_waits_and_is_done_once_it_is_active_again():
    a = allocation(INTERRUPTED)
    repo = FakeAllocationRepository(a)
    owner = uuid.uuid4()
    cmd = c.ReleaseAllocation(allocation_id=a.id, tenant_id=TENANT, requested_by=owner)
    uow = FakeUnitOfWork("allocation", "allocation.release", cmd)
    await handlers.release(uow, cmd, repository=factory(repo))
    assert uow.types() == [] and repo.rows[a.id].state == INTERRUPTED and repo.rows[a.id].release_pending
    published = []

    async def publish(ev):
        published.append(ev)
    await handlers.activate_step(repo, activate_cmd(a), publish=publish)
    assert [type(e) for e in published] == [events.Rescheduled, events.ReleaseRequested]
    assert published[1].requested_by == owner and published[1].node_id == NEW_NODE
    assert repo.rows[a.id].state == RELEASING and not repo.rows[a.id].release_pending


async def test_an_interruption_time_without_a_zone_is_taken_as_utc():
    a = allocation(ACTIVE)
    repo = FakeAllocationRepository(a)
    lost = datetime.now(UTC) - timedelta(minutes=1)
    await interrupt(repo, interrupt_cmd(a, lost=lost.replace(tzinfo=None)))
    assert repo.rows[a.id].interrupted_at == lost
