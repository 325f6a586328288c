"""A batch of reservations run without savepoints (``Writes.batched``) leaves its claims for one ``claim_each``
just before the batch writes, then answers each as a lone reserve would; a refused claim fails the run and marks
the index for a reload; a second reserve of an allocation whose claim waits finds it held (no second claim).
A batch of gangs leaves its members' claims the same way. Over the in-memory repository, with the participant
kit's outcomes on a fake connection."""
from __future__ import annotations

import uuid

import pytest

from services.scheduler import contracts as c
from services.scheduler import handlers as h
from services.scheduler.handlers.claim_batch import ClaimsRefused
from shared.unit_of_work import Writes
from shared.wire import step_key
from tests.support.fakes import FakeUnitOfWork
from tests.unit.test_scheduler_handlers import TENANT, onboard, quota, reserve_cmd, scheduler, with_spot_tenant


async def _batch(active, conn, cmds, handler=h.reserve_slots, type_="scheduler.reserve_slots"
                 ) -> tuple[Writes, list[FakeUnitOfWork]]:
    """Run ``cmds``' handlers (reserves by default) as one batched run (nothing written yet)."""
    writes = Writes()
    writes.batched = True
    units = []
    for cmd in cmds:
        uow = FakeUnitOfWork("scheduler", type_, cmd)
        uow.conn, uow.writes = conn, writes
        await handler(uow, cmd, active=active)
        units.append(uow)
    return writes, units


async def test_a_batchs_claims_are_made_together_before_it_writes_and_each_is_answered():
    active, repo, conn = await scheduler()
    node = await onboard(active, conn)
    await quota(active, conn, 8)
    cmds = [reserve_cmd("vm.1gpu", 1) for _ in range(3)]
    writes, units = await _batch(active, conn, cmds)
    assert repo.allocations == {} and all(u.emitted == [] for u in units)      # left for the batch
    await writes.write(conn)
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
    await _refused_when_written(active, repo, conn, writes, units, limit=1)     # the second claim is refused


async def _refused_when_written(active, repo, conn, writes: Writes, units: list[FakeUnitOfWork], *, limit: int) -> None:
    """The quota lowered under the index to ``limit``: writing the batch fails and marks the index for a reload."""
    repo.quotas_[next(iter(repo.quotas_))]["limit"] = limit
    with pytest.raises(ClaimsRefused):
        await writes.write(conn)
    assert active.needs_reload is True


async def test_a_second_reserve_of_an_allocation_whose_claim_waits_finds_it_held():
    active, repo, conn = await scheduler()
    await onboard(active, conn)
    await quota(active, conn, 8)
    first = reserve_cmd("vm.1gpu", 1)
    retried = first.model_copy(update={"idempotency_key": step_key(first.saga_id, "reserve_slots#2")})
    writes, (one, two) = await _batch(active, conn, [first, retried])
    await writes.write(conn)
    a, b = one.only("scheduler.slots_reserved").data, two.only("scheduler.slots_reserved").data
    assert (a["node_id"], a["slots"]) == (b["node_id"], b["slots"]) and len(repo.allocations) == 1


async def test_a_holder_placed_earlier_in_the_batch_is_claimed_before_it_is_preempted_and_gets_its_notice():
    active, repo, conn, spot_tenant = await with_spot_tenant()
    spot = reserve_cmd(tenant=spot_tenant, spot=True)
    writes, (holder, preemptor) = await _batch(active, conn, [spot, reserve_cmd(priority=100)])
    assert preemptor.types() == ["scheduler.preemption_notice", "scheduler.reservation_queued"]
    assert preemptor.emitted[0].data["allocation_id"] == str(spot.allocation_id)
    assert holder.only("scheduler.slots_reserved") and spot.allocation_id in repo.preemptions
    await writes.write(conn)


def gang_cmd(members: int) -> c.ReserveGang:
    return c.ReserveGang(gang_id=uuid.uuid4(), tenant_id=TENANT, shape="vm.1gpu", gpu_count=1,
                         members=[uuid.uuid4() for _ in range(members)], requested_by="bench")


async def _gang_batch(active, conn, cmds) -> tuple[Writes, list[FakeUnitOfWork]]:
    return await _batch(active, conn, cmds, h.reserve_gang, "scheduler.reserve_gang")


async def test_a_batchs_gangs_leave_their_members_claims_for_one_round_trip_before_it_writes():
    active, repo, conn = await scheduler()
    await onboard(active, conn)
    await quota(active, conn, 8)
    cmds = [gang_cmd(2), gang_cmd(2)]
    writes, units = await _gang_batch(active, conn, cmds)
    assert repo.allocations == {}                                   # left for the batch
    placed = [u.only("scheduler.gang_placed").data for u in units]
    await writes.write(conn)
    assert set(repo.allocations) == {m for cmd in cmds for m in cmd.members}
    for answer in placed:
        for m in answer["members"]:
            held = repo.allocations[uuid.UUID(m["allocation_id"])]
            assert (str(held["node_id"]), list(held["slots"])) == (m["node_id"], m["slots"])
    assert await repo.quota_used(TENANT, "L40S", "shared") == 4
    assert {repo.gangs[cmd.gang_id]["state"] for cmd in cmds} == {"placed"}


async def test_a_refused_member_fails_the_batch_of_gangs_and_marks_the_index_for_a_reload():
    active, repo, conn = await scheduler()
    await onboard(active, conn)
    await quota(active, conn, 8)
    writes, units = await _gang_batch(active, conn, [gang_cmd(2), gang_cmd(2)])
    await _refused_when_written(active, repo, conn, writes, units, limit=3)     # the last member is refused
