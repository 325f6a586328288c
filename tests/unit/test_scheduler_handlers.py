"""Scheduler's handlers over an in-memory repository, the participant kit's outcomes on a fake connection, and a
recording unit of work (no I/O): onboarding a node, reserving (placed, queued, refused), releasing, cancelling,
cordoning and preempting, as the index decides and the repository's claim confirms."""
from __future__ import annotations

import uuid

from services.node_agent.adapters.discovery.sim import sim_topology
from services.scheduler import contracts as c
from services.scheduler import handlers as h
from services.scheduler.handlers.active import ActiveScheduler
from services.scheduler.settings import SchedulerSettings
from shared.wire import step_key
from tests.support.fakes import FakeUnitOfWork, factory
from tests.support.scheduler_fakes import FakePool, FakeSchedulerRepository
from tests.support.steps import StepConnection

TENANT, ADMIN = uuid.uuid4(), uuid.uuid4()


async def scheduler(**settings) -> tuple[ActiveScheduler, FakeSchedulerRepository, StepConnection]:
    """A loaded index over an empty fake store, with the shared pool, vm.1gpu and vm.4gpu shapes."""
    repo = FakeSchedulerRepository()
    conn = StepConnection(repo)
    active = ActiveScheduler(SchedulerSettings(burn_in=False, **settings), repository=factory(repo))
    await active.load(FakePool(conn))
    for cmd in (c.DefinePool(name="shared"), c.DefineShape(name="vm.1gpu", kind="vm", gpu_count=1),
                c.DefineShape(name="vm.4gpu", kind="vm", gpu_count=4)):
        await run(h.define_pool if isinstance(cmd, c.DefinePool) else h.define_shape, cmd, active, conn)
    return active, repo, conn


async def run(handler, cmd, active: ActiveScheduler, conn: StepConnection, type_: str | None = None) -> FakeUnitOfWork:
    """Run ``handler`` as the consumer would, then what it left for after the commit."""
    uow = FakeUnitOfWork("scheduler", type_ or f"scheduler.{handler.__name__}", cmd)
    uow.conn = conn
    await handler(uow, cmd, active=active)
    await uow.run_after_commit()
    return uow


async def onboard(active, conn, name: str = "node-a") -> uuid.UUID:
    """Declare, report (4 x L40S) and approve a node; returns its id."""
    node = uuid.uuid4()
    await run(h.register_node, c.RegisterNode(node_id=node, name=name, gpu_model="L40S", gpu_count=4), active, conn)
    topology = sim_topology(name, "pcie-l40s-4").to_dict()
    await run(h.report_topology, c.ReportTopology(node_id=node, driver="sim", topology=topology), active, conn)
    await run(h.approve_slot_map, c.ApproveSlotMap(node_id=node, proposal=1, approved_by=ADMIN), active, conn)
    return node


async def quota(active, conn, limit: int, tenant: uuid.UUID = TENANT) -> None:
    await run(h.set_quota, c.SetQuota(tenant_id=tenant, gpu_model="L40S", pool="shared", limit=limit, set_by=ADMIN),
              active, conn)


def reserve_cmd(shape: str = "vm.4gpu", gpus: int = 4, *, tenant: uuid.UUID = TENANT, **fields) -> c.ReserveSlots:
    saga = uuid.uuid4()
    return c.ReserveSlots(saga_id=saga, step="reserve_slots", idempotency_key=step_key(saga, "reserve_slots"),
                          allocation_id=uuid.uuid4(), tenant_id=tenant, shape=shape, gpu_count=gpus, **fields)


def release_cmd(reserve: c.ReserveSlots) -> c.ReleaseSlots:
    return c.ReleaseSlots(saga_id=reserve.saga_id, step="release_slots",
                          idempotency_key=step_key(reserve.saga_id, "release_slots"),
                          allocation_id=reserve.allocation_id, tenant_id=reserve.tenant_id)


async def reserve(active, conn, cmd: c.ReserveSlots) -> FakeUnitOfWork:
    return await run(h.reserve_slots, cmd, active, conn, "scheduler.reserve_slots")


# --- onboarding ------------------------------------------------------------------------------------------------
async def test_a_topology_report_of_an_undeclared_node_stores_it_by_id_with_a_proposal_to_approve():
    active, repo, conn = await scheduler()
    node = uuid.uuid4()
    topology = sim_topology("node-x", "pcie-l40s-4").to_dict()
    uow = await run(h.report_topology, c.ReportTopology(node_id=node, driver="sim", topology=topology), active, conn)
    doc = uow.only("scheduler.node_changed").data
    assert (doc["status"], doc["proposal"], doc["name"]) == ("pending_approval", 1, f"undeclared-{node}")
    assert len(doc["proposed_slot_map"]["slots"]) == 4 and repo.nodes_[node]["declared"] is False


async def test_approving_a_stale_proposal_is_rejected_and_changes_nothing():
    active, repo, conn = await scheduler()
    node = await onboard(active, conn)
    before = repo.snapshot()
    uow = await run(h.approve_slot_map, c.ApproveSlotMap(node_id=node, proposal=7, approved_by=ADMIN), active, conn)
    assert "no slot-map proposal" in uow.only("scheduler.admin_command_rejected").data["reason"]
    assert repo.snapshot() == before


async def test_an_approved_node_is_schedulable_with_its_slots_free():
    active, repo, conn = await scheduler()
    node = await onboard(active, conn)
    doc = await repo.node_document(node)
    assert (doc["status"], doc["free_slots"], doc["capacity"]["free_slots"]) == ("schedulable", 4, 4)


# --- reserve and release ---------------------------------------------------------------------------------------
async def test_reserve_claims_slots_charges_the_quota_and_answers_with_the_nodes_capacity():
    active, repo, conn = await scheduler()
    node = await onboard(active, conn)
    await quota(active, conn, 8)
    cmd = reserve_cmd()
    reply = (await reserve(active, conn, cmd)).only("scheduler.slots_reserved").data
    assert (reply["node_id"], len(reply["slots"]), reply["capacity"]["free_slots"]) == (str(node), 4, 0)
    assert repo.allocations[cmd.allocation_id]["gpus"] == 4 and await repo.quota_used(TENANT, "L40S", "shared") == 4
    assert conn.status(cmd.idempotency_key) == "done"
    again = (await reserve(active, conn, cmd)).only("scheduler.slots_reserved").data
    assert again["slots"] == reply["slots"] and len(repo.allocations) == 1


async def test_a_reserve_over_quota_fails_naming_the_quota_and_claims_nothing():
    active, repo, conn = await scheduler()
    await onboard(active, conn)
    await quota(active, conn, 2)
    failed = (await reserve(active, conn, reserve_cmd())).only("scheduler.slot_reservation_failed").data
    assert (failed["code"], failed["limit"], failed["requested"]) == ("quota-exceeded", 2, 4)
    assert repo.allocations == {}


async def test_an_unknown_shape_fails_at_once():
    active, _, conn = await scheduler()
    failed = (await reserve(active, conn, reserve_cmd("vm.3gpu", 3))).only("scheduler.slot_reservation_failed")
    assert failed.data["code"] == "unknown-shape"


async def test_a_request_that_does_not_fit_waits_in_the_queue_and_is_placed_when_the_holder_releases():
    active, repo, conn = await scheduler()
    node = await onboard(active, conn)
    await quota(active, conn, 8)
    first, second = reserve_cmd(), reserve_cmd()
    await reserve(active, conn, first)
    queued = (await reserve(active, conn, second)).only("scheduler.reservation_queued").data
    assert queued["position"] == 1 and second.allocation_id in repo.queue
    assert conn.status(second.idempotency_key) == "deferred"
    fast = await reserve(active, conn, reserve_cmd(fail_fast=True))
    assert fast.only("scheduler.slot_reservation_failed").data["code"] == "no-capacity"
    released = await run(h.release_slots, release_cmd(first), active, conn, "scheduler.release_slots")
    assert released.types() == ["scheduler.slots_released", "scheduler.slots_reserved"]
    placed = released.emitted[1].data
    assert (placed["allocation_id"], placed["node_id"]) == (str(second.allocation_id), str(node))
    assert repo.queue == {} and conn.status(second.idempotency_key) == "done"


async def test_releasing_twice_frees_once_and_refunds_the_quota_once():
    active, repo, conn = await scheduler()
    await onboard(active, conn)
    await quota(active, conn, 8)
    cmd = reserve_cmd()
    await reserve(active, conn, cmd)
    first = (await run(h.release_slots, release_cmd(cmd), active, conn, "scheduler.release_slots")).emitted[0].data
    again = (await run(h.release_slots, release_cmd(cmd), active, conn, "scheduler.release_slots")).emitted[0].data
    assert (first["slots_freed"], again["slots_freed"]) == (4, 0)
    assert await repo.quota_used(TENANT, "L40S", "shared") == 0


async def test_cancelling_another_tenants_queued_request_is_rejected_and_the_owner_may_cancel_it():
    active, repo, conn = await scheduler()
    await onboard(active, conn)
    await quota(active, conn, 8)
    await reserve(active, conn, reserve_cmd())
    waiting = reserve_cmd()
    await reserve(active, conn, waiting)
    intruder = c.CancelRequest(allocation_id=waiting.allocation_id, tenant_id=uuid.uuid4(), requested_by=ADMIN)
    uow = await run(h.cancel_request, intruder, active, conn)
    assert "belongs to another tenant" in uow.only("scheduler.admin_command_rejected").data["reason"]
    assert waiting.allocation_id in repo.queue        # the savepoint put the request back
    owner = c.CancelRequest(allocation_id=waiting.allocation_id, tenant_id=TENANT, requested_by=ADMIN)
    failed = (await run(h.cancel_request, owner, active, conn)).only("scheduler.slot_reservation_failed").data
    assert failed["code"] == "cancelled" and repo.queue == {}


# --- cordon and preemption -------------------------------------------------------------------------------------
async def test_a_cordoned_node_takes_no_new_placement_and_says_so_in_its_document():
    active, repo, conn = await scheduler()
    node = await onboard(active, conn)
    await quota(active, conn, 8)
    uow = await run(h.update_node, c.UpdateNode(node_id=node, cordoned=True, requested_by=ADMIN), active, conn)
    assert uow.only("scheduler.node_changed").data["cordoned"] is True
    failed = await reserve(active, conn, reserve_cmd(fail_fast=True))
    assert failed.only("scheduler.slot_reservation_failed").data["code"] == "no-capacity"


async def with_spot_tenant() -> tuple[ActiveScheduler, FakeSchedulerRepository, StepConnection, uuid.UUID]:
    """One node, quota for TENANT and for a spot tenant (returned last)."""
    active, repo, conn = await scheduler()
    await onboard(active, conn)
    spot_tenant = uuid.uuid4()
    await quota(active, conn, 8)
    await quota(active, conn, 8, tenant=spot_tenant)
    return active, repo, conn, spot_tenant


async def test_a_high_priority_request_queues_and_sends_a_preemption_notice_to_the_spot_holder():
    active, repo, conn, spot_tenant = await with_spot_tenant()
    spot = reserve_cmd(tenant=spot_tenant, spot=True)
    await reserve(active, conn, spot)
    uow = await reserve(active, conn, reserve_cmd(priority=100))
    assert uow.types() == ["scheduler.preemption_notice", "scheduler.reservation_queued"]
    notice = uow.emitted[0]
    assert notice.data["allocation_id"] == str(spot.allocation_id) and notice.tenant_id == spot_tenant
    assert spot.allocation_id in repo.preemptions


async def test_a_reserve_reads_its_allocations_standing_only_when_the_index_may_not_know_it():
    """With leader election the index knows every holding and queued request: a new allocation's standing is not
    read; one the index holds is (a repeat under another key gets the same slots); without election, always."""
    for election, reads_for_new in ((True, 0), (False, 1)):
        active, repo, conn = await scheduler(leader_election=election)
        await onboard(active, conn)
        await quota(active, conn, 8)
        reads = []
        standing = repo.standing

        async def counted(allocation_id, standing=standing, reads=reads):
            reads.append(allocation_id)
            return await standing(allocation_id)
        repo.standing = counted
        cmd = reserve_cmd()
        first = (await reserve(active, conn, cmd)).only("scheduler.slots_reserved").data
        assert len(reads) == reads_for_new
        other_key = cmd.model_copy(update={"idempotency_key": step_key(uuid.uuid4(), "reserve_slots")})
        again = (await reserve(active, conn, other_key)).only("scheduler.slots_reserved").data
        assert reads[-1] == cmd.allocation_id and again["slots"] == first["slots"] and len(repo.allocations) == 1
