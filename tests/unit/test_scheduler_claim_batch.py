"""A batch of reservations run without savepoints (``Writes.batched``) leaves its claims for one ``claim_each``
just before the batch writes, then answers each as a lone reserve would; a refused claim fails the run and marks
the index for a reload; a second reserve of an allocation whose claim waits finds it held (no second claim).
Over the in-memory repository, with the participant kit's outcomes on a fake connection."""
from __future__ import annotations

from services.scheduler import handlers as h
from services.scheduler.handlers.claim_batch import ClaimsRefused
from shared.unit_of_work import Writes
from shared.wire import step_key
from tests.support.fakes import FakeUnitOfWork
from tests.unit.test_scheduler_handlers import TENANT, onboard, quota, reserve_cmd, scheduler, with_spot_tenant


async def _batch(active, conn, cmds) -> tuple[Writes, list[FakeUnitOfWork]]:
    """Run ``cmds``' reserves as one batched run (nothing written yet)."""
    writes = Writes()
    writes.batched = True
    units = []
    for cmd in cmds:
        uow = FakeUnitOfWork("scheduler", "scheduler.reserve_slots", cmd)
        uow.conn, uow.writes = conn, writes
        await h.reserve_slots(uow, cmd, active=active)
        units.append(uow)
    return writes, units


async def test_a_batchs_claims_are_made_together_before_it_writes_and_each_is_answered():
    active, repo, conn = await scheduler()
    node = await onboard(active, conn)
    await quota(active, conn, 8)
    cmds = [reserve_cmd("vm.1gpu", 1) for _ in range(3)]
    writes, units = await _batch(active, conn, cmds)
    assert repo.allocations == {} and all(u.emitted == [] for u in units)      # left for the batch
    await writes.write(conn, units[0].outbox)
    replies = [u.only("scheduler.slots_reserved").data for u in units]
    assert {r["node_id"] for r in replies} == {str(node)}
    assert len({r["slots"][0] for r in replies}) == 3 and [r["capacity"]["free_slots"] for r in replies] == [3, 2, 1]
    assert set(repo.allocations) == {c.allocation_id for c in cmds}
    assert await repo.quota_used(TENANT, "L40S", "shared") == 3
    assert all(conn.status(c.idempotency_key) == "done" for c in cmds)


async def test_a_refused_claim_fails_the_batched_run_and_marks_the_index_for_a_reload():
    active, repo, conn = await scheduler()
    await onboard(active, conn)
    await quota(active, conn, 8)
    writes, units = await _batch(active, conn, [reserve_cmd("vm.1gpu", 1) for _ in range(2)])
    repo.quotas_[next(iter(repo.quotas_))]["limit"] = 1     # lowered under the index: the second claim is refused
    try:
        await writes.write(conn, units[0].outbox)
        raise AssertionError("the batched run should have failed")
    except ClaimsRefused:
        pass
    assert active.needs_reload is True


async def test_a_second_reserve_of_an_allocation_whose_claim_waits_finds_it_held():
    active, repo, conn = await scheduler()
    await onboard(active, conn)
    await quota(active, conn, 8)
    first = reserve_cmd("vm.1gpu", 1)
    retried = first.model_copy(update={"idempotency_key": step_key(first.saga_id, "reserve_slots#2")})
    writes, (one, two) = await _batch(active, conn, [first, retried])
    await writes.write(conn, one.outbox)
    a, b = one.only("scheduler.slots_reserved").data, two.only("scheduler.slots_reserved").data
    assert (a["node_id"], a["slots"]) == (b["node_id"], b["slots"]) and len(repo.allocations) == 1


async def test_a_holder_placed_earlier_in_the_batch_is_claimed_before_it_is_preempted_and_gets_its_notice():
    active, repo, conn, spot_tenant = await with_spot_tenant()
    spot = reserve_cmd(tenant=spot_tenant, spot=True)
    writes, (holder, preemptor) = await _batch(active, conn, [spot, reserve_cmd(priority=100)])
    assert preemptor.types() == ["scheduler.preemption_notice", "scheduler.reservation_queued"]
    assert preemptor.emitted[0].data["allocation_id"] == str(spot.allocation_id)
    assert holder.only("scheduler.slots_reserved") and spot.allocation_id in repo.preemptions
    await writes.write(conn, holder.outbox)
