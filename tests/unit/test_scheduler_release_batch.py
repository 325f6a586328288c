"""A batch of releases run without savepoints (``Writes.batched``) withdraws every allocation in one round trip
(the repository's ``withdraw_each``) just before the batch writes, then answers each as a lone release would:
slots freed and the node's capacity, the quota refunded, the tombstone of the key it compensates, a waiting
request cancelled, the index freed only once committed; a second release of the same allocation in the batch
frees nothing again; a quarantine is made before the free. Over the in-memory repository."""
from __future__ import annotations

from services.scheduler import contracts as c
from services.scheduler import handlers as h
from tests.unit.test_scheduler_claim_batch import _batch
from tests.unit.test_scheduler_handlers import TENANT, onboard, quota, release_cmd, reserve, reserve_cmd, scheduler


def count_trips(repo) -> list[list]:
    """The repository's withdraw round trips, as they happen: a ``withdraw`` is one, a ``withdraw_each`` is one
    (whatever it does inside); each as the list of the allocations it withdrew."""
    trips, inside = [], []
    one, each = repo.withdraw, repo.withdraw_each

    async def withdraw(allocation_id):
        if not inside:
            trips.append([allocation_id])
        return await one(allocation_id)

    async def withdraw_each(allocation_ids):
        trips.append(list(allocation_ids))
        inside.append(True)
        try:
            return await each(allocation_ids)
        finally:
            inside.pop()
    repo.withdraw, repo.withdraw_each = withdraw, withdraw_each
    return trips


async def _one_node():
    """The index and the store with one node of 4 slots, TENANT's quota 8: (active, repo, conn, node)."""
    active, repo, conn = await scheduler()
    node = await onboard(active, conn)
    await quota(active, conn, 8)
    return active, repo, conn, node


async def _released(active, conn, cmds: list[c.ReleaseSlots]):
    """Run the releases as one batched run, write it, then what each left for after the commit."""
    writes, units = await _batch(active, conn, cmds, h.release_slots, "scheduler.release_slots")
    before = [u.types() for u in units]
    await writes.write(conn)
    for u in units:
        await u.run_after_commit()
    return before, units


async def test_a_batchs_releases_withdraw_in_one_round_trip_and_each_is_answered():
    active, repo, conn, node = await _one_node()
    reserves = [reserve_cmd("vm.1gpu", 1) for _ in range(3)]
    for cmd in reserves:
        await reserve(active, conn, cmd)
    trips = count_trips(repo)
    releases = [release_cmd(cmd).model_copy(update={"compensates": cmd.idempotency_key}) for cmd in reserves]
    before, units = await _released(active, conn, releases)
    assert before == [[], [], []]                                          # answered after the round trip
    assert trips == [[cmd.allocation_id for cmd in reserves]]
    replies = [u.only("scheduler.slots_released").data for u in units]
    assert [(r["slots_freed"], r["node_id"]) for r in replies] == [(1, str(node))] * 3
    assert [r["capacity"]["free_slots"] for r in replies] == [2, 3, 4]
    assert [r["allocation_id"] for r in replies] == [str(cmd.allocation_id) for cmd in reserves]
    assert repo.allocations == {} and await repo.quota_used(TENANT, "L40S", "shared") == 0
    assert all(conn.status(cmd.idempotency_key) == "compensated" for cmd in reserves)
    placed = await reserve(active, conn, reserve_cmd())                   # the index freed all four
    assert placed.only("scheduler.slots_reserved").data["node_id"] == str(node)


async def test_a_release_repeated_in_the_batch_or_after_it_frees_nothing_more():
    active, repo, conn, _ = await _one_node()
    cmd = reserve_cmd()
    await reserve(active, conn, cmd)
    trips = count_trips(repo)
    _, units = await _released(active, conn, [release_cmd(cmd), release_cmd(cmd)])
    assert [u.only("scheduler.slots_released").data["slots_freed"] for u in units] == [4, 0]
    assert len(trips) == 2 and await repo.quota_used(TENANT, "L40S", "shared") == 0
    _, (again,) = await _released(active, conn, [release_cmd(cmd)])
    assert again.only("scheduler.slots_released").data["slots_freed"] == 0


async def test_a_request_released_while_waiting_in_a_batch_is_answered_cancelled():
    active, repo, conn, _ = await _one_node()
    holder, waiting = reserve_cmd(), reserve_cmd()
    await reserve(active, conn, holder)
    await reserve(active, conn, waiting)
    _, (freed, withdrawn) = await _released(active, conn, [release_cmd(holder), release_cmd(waiting)])
    assert freed.only("scheduler.slots_released").data["slots_freed"] == 4
    assert withdrawn.types() == ["scheduler.slot_reservation_failed", "scheduler.slots_released"]
    assert withdrawn.emitted[0].data["code"] == "cancelled" and conn.status(waiting.idempotency_key) == "failed"
    assert repo.queue == {} and repo.allocations == {}


async def test_a_batched_release_quarantines_its_failed_slot_before_it_frees_the_rest():
    active, repo, conn, node = await _one_node()
    cmd, other = reserve_cmd(), reserve_cmd("vm.1gpu", 1)
    slots = (await reserve(active, conn, cmd)).only("scheduler.slots_reserved").data["slots"]
    wiped = release_cmd(cmd).model_copy(update={"quarantine": [c.QuarantineSlot(slot=slots[0], reason="wipe failed")]})
    before, (released, _) = await _released(active, conn, [wiped, release_cmd(other)])
    assert before[0] == ["scheduler.slot_state_changed"]                  # made in the handler, before the free
    assert released.types() == ["scheduler.slot_state_changed", "scheduler.node_changed", "scheduler.slots_released"]
    assert released.emitted[2].data["slots_freed"] == 4 and released.emitted[2].data["capacity"]["free_slots"] == 3
    assert repo.slots[(node, slots[0])]["quarantine_reason"] == "wipe failed"
    full = await reserve(active, conn, reserve_cmd(fail_fast=True))        # the index keeps the slot out
    assert full.only("scheduler.slot_reservation_failed").data["code"] == "no-capacity"
