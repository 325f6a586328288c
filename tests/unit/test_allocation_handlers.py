"""Allocation's handlers over an in-memory repository and a recording unit of work (no I/O): what each command
stores and emits, and what it refuses."""
from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from services.allocation import contracts as c
from services.allocation import handlers
from services.allocation.domain.model import ACTIVE, FAILED, RELEASED, RELEASING, REQUESTED, Allocation
from shared.participant import StepRejected
from shared.refusals import PermanentError
from shared.wire import step_key
from tests.support.fakes import FakeAllocationRepository, FakeUnitOfWork, factory

T0 = datetime(2030, 1, 1, tzinfo=UTC)
TENANT, NODE = uuid.uuid4(), uuid.uuid4()


def allocation(state: str = REQUESTED, *, tenant: uuid.UUID = TENANT) -> Allocation:
    """A stored allocation brought to ``state`` by the aggregate's own commands (on NODE once activated)."""
    a = Allocation.request(uuid.uuid4(), tenant, uuid.uuid4(), "train-1", "vm.2gpu", 2, 50, {"team": "ml"}, T0)
    if state in (ACTIVE, RELEASING, RELEASED):
        a.activate(NODE, T0)
    if state in (RELEASING, RELEASED):
        a.release(uuid.uuid4(), T0)
    if state == RELEASED:
        a.mark_released(T0)
    if state == FAILED:
        a.fail("reserve_slots", "no capacity", T0)
    a.pull_events()
    return a


async def handle(handler, type_: str, cmd, repo: FakeAllocationRepository) -> FakeUnitOfWork:
    """Run ``handler`` as the consumer would for a ``type_`` message; the unit of work records what it emitted."""
    uow = FakeUnitOfWork("allocation", type_, cmd)
    await handler(uow, cmd, repository=factory(repo))
    return uow


def request_cmd(**overrides) -> c.RequestAllocation:
    fields = dict(allocation_id=uuid.uuid4(), tenant_id=TENANT, user_id=uuid.uuid4(), name="train-1", shape="vm.2gpu",
                  gpu_count=2, volume_gb=50, labels={"team": "ml"}, priority=5, spot=True)
    fields.update(overrides)
    return c.RequestAllocation(**fields)


def step_cmd(model, a: Allocation, step: str, **extra):
    saga = uuid.uuid4()
    return model(saga_id=saga, step=step, idempotency_key=step_key(saga, step), allocation_id=a.id,
                 tenant_id=a.tenant_id, **extra)


def release_cmd(a: Allocation, tenant: uuid.UUID = TENANT, *, withdrawn: bool = False) -> c.ReleaseAllocation:
    return c.ReleaseAllocation(allocation_id=a.id, tenant_id=tenant, requested_by=uuid.uuid4(), withdrawn=withdrawn)


def preempt_cmd(a: Allocation) -> c.PreemptAllocation:
    return c.PreemptAllocation(allocation_id=a.id, tenant_id=a.tenant_id, reason="a priority 100 allocation needs the GPUs")


def fail_cmd(a: Allocation) -> c.FailAllocation:
    return c.FailAllocation(allocation_id=a.id, saga_id=uuid.uuid4(), failed_step="provision_node", reason="node lost")


# --- request ---------------------------------------------------------------------------------------------------
async def test_request_stores_a_requested_allocation_and_emits_requested_with_its_spec_for_its_tenant():
    repo, cmd = FakeAllocationRepository(), request_cmd()
    uow = await handle(handlers.request, "allocation.request", cmd, repo)
    stored = repo.rows[cmd.allocation_id]
    assert (stored.state, stored.name, stored.node_id, stored.options["priority"]) == (REQUESTED, "train-1", None, 5)
    env = uow.only("allocation.requested")
    assert env.tenant_id == TENANT and env.correlation_id == str(cmd.allocation_id)
    assert {k: env.data[k] for k in ("state", "shape", "gpu_count", "volume_gb", "labels", "priority", "spot")} == {
        "state": REQUESTED, "shape": "vm.2gpu", "gpu_count": 2, "volume_gb": 50, "labels": {"team": "ml"},
        "priority": 5, "spot": True}


async def test_a_request_for_an_existing_id_keeps_the_stored_allocation_and_emits_nothing():
    existing = allocation(ACTIVE)
    repo = FakeAllocationRepository(existing)
    uow = await handle(handlers.request, "allocation.request",
                       request_cmd(allocation_id=existing.id, name="other", volume_gb=7), repo)
    assert uow.emitted == []
    assert (repo.rows[existing.id].state, repo.rows[existing.id].name, repo.rows[existing.id].volume_gb) == (
        ACTIVE, "train-1", 50)


async def test_a_request_whose_gpu_count_is_not_the_shapes_is_rejected_naming_the_shape_and_stores_nothing():
    repo, cmd = FakeAllocationRepository(), request_cmd(shape="vm.4gpu", gpu_count=2)
    uow = await handle(handlers.request, "allocation.request", cmd, repo)
    rejected = uow.only("allocation.command_rejected").data
    assert rejected["command"] == "allocation.request" and "vm.4gpu" in rejected["reason"]
    assert repo.rows == {}


# --- activate (saga step) --------------------------------------------------------------------------------------
async def test_the_activate_step_makes_the_allocation_active_on_the_node_and_replies_with_state_and_node():
    a = allocation(REQUESTED)
    repo, node = FakeAllocationRepository(a), uuid.uuid4()
    cmd = step_cmd(c.ActivateAllocation, a, "activate", node_id=node)
    reply = await handlers.activate_step(repo, cmd)
    assert (repo.rows[a.id].state, repo.rows[a.id].node_id) == (ACTIVE, node)
    assert (reply["state"], reply["node_id"], reply["tenant_id"]) == (ACTIVE, node, TENANT)
    # what the participant kit sends: the command's step fields and these
    sent = c.AllocationActivated(saga_id=cmd.saga_id, step=cmd.step, idempotency_key=cmd.idempotency_key,
                                 allocation_id=a.id, **reply)
    assert sent.state == ACTIVE


async def test_the_activated_reply_tells_billing_what_the_allocation_is_metered_by():
    """Billing meters an allocation from its activated event: its spec, user, spot and quoted price, and the
    reservation's GPU model and pool (the command's)."""
    quote = {"price_list_version": "2030-01", "currency": "USD", "micros_per_gpu_hour": 2_000_000, "sku_id": "vm.2gpu",
             "gpu_count": 2, "hourly_amount": "4", "quoted_at": T0.isoformat()}
    a = Allocation.request(uuid.uuid4(), TENANT, uuid.uuid4(), "train-1", "vm.2gpu", 2, 0, {}, T0,
                           options={"spot": True, "price": quote})
    cmd = step_cmd(c.ActivateAllocation, a, "activate", node_id=NODE, gpu_model="H100", pool="west")
    reply = await handlers.activate_step(FakeAllocationRepository(a), cmd)
    sent = c.AllocationActivated(saga_id=cmd.saga_id, step=cmd.step, idempotency_key=cmd.idempotency_key,
                                 allocation_id=a.id, **reply)
    assert (sent.shape, sent.gpu_count, sent.user_id, sent.spot) == ("vm.2gpu", 2, a.user_id, True)
    assert (sent.gpu_model, sent.pool, sent.price.micros_per_gpu_hour) == ("H100", "west", 2_000_000)


async def test_the_activate_step_again_on_the_same_node_is_a_no_op_with_the_same_reply():
    a = allocation(ACTIVE)
    repo = FakeAllocationRepository(a)
    reply = await handlers.activate_step(repo, step_cmd(c.ActivateAllocation, a, "activate", node_id=NODE))
    assert (reply["state"], reply["node_id"], reply["at"]) == (ACTIVE, NODE, a.updated_at)
    assert repo.rows[a.id].updated_at == a.updated_at


@pytest.mark.parametrize("state", [FAILED, RELEASING, RELEASED])
async def test_the_activate_step_from_a_state_that_forbids_it_is_rejected_naming_the_state_and_changes_nothing(state):
    a = allocation(state)
    repo = FakeAllocationRepository(a)
    with pytest.raises(StepRejected, match=f"it is {state}"):
        await handlers.activate_step(repo, step_cmd(c.ActivateAllocation, a, "activate", node_id=uuid.uuid4()))
    assert (repo.rows[a.id].state, repo.rows[a.id].node_id) == (state, a.node_id)


async def test_the_activate_step_on_another_node_than_the_active_one_is_rejected():
    a = allocation(ACTIVE)
    repo = FakeAllocationRepository(a)
    with pytest.raises(StepRejected):
        await handlers.activate_step(repo, step_cmd(c.ActivateAllocation, a, "activate", node_id=uuid.uuid4()))
    assert repo.rows[a.id].node_id == NODE


async def test_the_activate_step_of_an_unknown_allocation_is_rejected():
    ghost = allocation()
    with pytest.raises(StepRejected, match="no allocation"):
        await handlers.activate_step(FakeAllocationRepository(), step_cmd(c.ActivateAllocation, ghost, "activate",
                                                                          node_id=NODE))


# --- release and preempt ---------------------------------------------------------------------------------------
async def test_release_moves_an_active_allocation_to_releasing_and_emits_release_requested_with_node_volume_labels():
    a = allocation(ACTIVE)
    repo, cmd = FakeAllocationRepository(a), release_cmd(a)
    uow = await handle(handlers.release, "allocation.release", cmd, repo)
    assert repo.rows[a.id].state == RELEASING
    data = uow.only("allocation.release_requested").data
    assert (data["state"], data["node_id"], data["volume_gb"], data["labels"], data["requested_by"], data["reason"]) == (
        RELEASING, str(NODE), 50, {"team": "ml"}, str(cmd.requested_by), None)


async def test_release_of_a_requested_allocation_the_saga_withdrew_moves_it_to_releasing_without_a_node():
    a = allocation(REQUESTED)
    repo = FakeAllocationRepository(a)
    uow = await handle(handlers.release, "allocation.release", release_cmd(a, withdrawn=True), repo)
    assert repo.rows[a.id].state == RELEASING
    data = uow.only("allocation.release_requested").data
    assert (data["state"], data["node_id"]) == (RELEASING, None)


@pytest.mark.parametrize("state", [REQUESTED, FAILED])
async def test_release_while_the_allocate_saga_may_run_or_after_failure_is_rejected_with_the_state_and_changes_nothing(
        state):
    """REQUESTED lasts while the allocate saga runs: only the coordinator's withdrawal (``withdrawn``) releases it."""
    a = allocation(state)
    repo = FakeAllocationRepository(a)
    uow = await handle(handlers.release, "allocation.release", release_cmd(a), repo)
    rejected = uow.only("allocation.command_rejected").data
    assert rejected["command"] == "allocation.release"
    assert state in rejected["reason"] and "only an ACTIVE allocation can be released" in rejected["reason"]
    assert repo.rows[a.id].state == state


async def test_release_by_another_tenant_is_rejected_naming_that_tenant_and_changes_nothing():
    a = allocation(ACTIVE)
    repo, intruder = FakeAllocationRepository(a), uuid.uuid4()
    uow = await handle(handlers.release, "allocation.release", release_cmd(a, tenant=intruder), repo)
    assert str(intruder) in uow.only("allocation.command_rejected").data["reason"]
    assert repo.rows[a.id].state == ACTIVE


async def test_release_of_an_unknown_allocation_is_rejected():
    uow = await handle(handlers.release, "allocation.release", release_cmd(allocation(ACTIVE)), FakeAllocationRepository())
    assert uow.only("allocation.command_rejected").data["command"] == "allocation.release"


async def assert_no_op(handler, type_: str, command, state: str) -> None:
    """``command`` (built from the allocation) on an allocation in ``state`` emits nothing and keeps the state."""
    a = allocation(state)
    repo = FakeAllocationRepository(a)
    uow = await handle(handler, type_, command(a), repo)
    assert uow.emitted == [] and repo.rows[a.id].state == state


@pytest.mark.parametrize("state", [RELEASING, RELEASED])
async def test_releasing_an_allocation_that_is_releasing_or_released_is_a_no_op(state):
    await assert_no_op(handlers.release, "allocation.release", release_cmd, state)


async def test_preempt_moves_an_active_allocation_to_releasing_recording_the_reason_in_row_and_event():
    a = allocation(ACTIVE)
    repo = FakeAllocationRepository(a)
    uow = await handle(handlers.preempt, "allocation.preempt", preempt_cmd(a), repo)
    reason = "preempted: a priority 100 allocation needs the GPUs"
    assert (repo.rows[a.id].state, repo.rows[a.id].reason) == (RELEASING, reason)
    data = uow.only("allocation.release_requested").data
    assert (data["reason"], data["requested_by"], data["node_id"]) == (reason, None, str(NODE))


@pytest.mark.parametrize("state", [RELEASING, RELEASED, FAILED])
async def test_preempting_an_allocation_that_is_releasing_released_or_failed_is_a_no_op(state):
    await assert_no_op(handlers.preempt, "allocation.preempt", preempt_cmd, state)


async def test_preempting_an_allocation_before_it_is_active_is_rejected_and_changes_nothing():
    a = allocation(REQUESTED)
    repo = FakeAllocationRepository(a)
    uow = await handle(handlers.preempt, "allocation.preempt", preempt_cmd(a), repo)
    rejected = uow.only("allocation.command_rejected").data
    assert rejected["command"] == "allocation.preempt" and REQUESTED in rejected["reason"]
    assert repo.rows[a.id].state == REQUESTED


# --- fail ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("state", [REQUESTED, ACTIVE, RELEASING])
async def test_fail_moves_a_live_allocation_to_failed_recording_step_and_reason_and_emits_failed(state):
    a = allocation(state)
    repo = FakeAllocationRepository(a)
    uow = await handle(handlers.fail, "allocation.fail", fail_cmd(a), repo)
    stored = repo.rows[a.id]
    assert (stored.state, stored.failed_step, stored.reason) == (FAILED, "provision_node", "node lost")
    data = uow.only("allocation.failed").data
    assert (data["state"], data["failed_step"], data["reason"]) == (FAILED, "provision_node", "node lost")


async def test_failing_a_failed_allocation_again_keeps_the_first_reason_and_emits_nothing():
    a = allocation(FAILED)
    repo = FakeAllocationRepository(a)
    uow = await handle(handlers.fail, "allocation.fail", fail_cmd(a), repo)
    assert uow.emitted == [] and (repo.rows[a.id].failed_step, repo.rows[a.id].reason) == ("reserve_slots", "no capacity")


async def test_failing_a_released_allocation_is_an_illegal_transition_rejected_without_change():
    a = allocation(RELEASED)
    repo = FakeAllocationRepository(a)
    uow = await handle(handlers.fail, "allocation.fail", fail_cmd(a), repo)
    rejected = uow.only("allocation.command_rejected").data
    assert rejected["command"] == "allocation.fail" and "RELEASED → FAILED is not a legal transition" in rejected["reason"]
    assert repo.rows[a.id].state == RELEASED


# --- mark_released (saga step) ---------------------------------------------------------------------------------
async def test_the_mark_released_step_moves_a_releasing_allocation_to_released_and_replies_with_the_state():
    a = allocation(RELEASING)
    repo = FakeAllocationRepository(a)
    cmd = step_cmd(c.MarkReleased, a, "mark_released")
    reply = await handlers.mark_released_step(repo, cmd)
    assert repo.rows[a.id].state == RELEASED
    assert (reply["state"], reply["tenant_id"]) == (RELEASED, TENANT)
    c.AllocationReleased(saga_id=cmd.saga_id, step=cmd.step, idempotency_key=cmd.idempotency_key,
                         allocation_id=a.id, **reply)


async def test_the_mark_released_step_of_an_active_allocation_is_a_permanent_error_and_changes_nothing():
    a = allocation(ACTIVE)
    repo = FakeAllocationRepository(a)
    with pytest.raises(PermanentError, match="ACTIVE"):
        await handlers.mark_released_step(repo, step_cmd(c.MarkReleased, a, "mark_released"))
    assert repo.rows[a.id].state == ACTIVE


async def test_an_unsaved_change_is_not_stored():
    """The fake keeps what a handler saves, not what it loaded and changed (as the database does)."""
    a = allocation(REQUESTED)
    repo = FakeAllocationRepository(a)
    loaded = await repo.get_for_update(a.id)
    loaded.fail("x", "y", T0)
    assert repo.rows[a.id].state == REQUESTED
