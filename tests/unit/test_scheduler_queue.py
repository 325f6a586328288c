"""The fair pending queue: priorities, per-tenant FIFO, fair share, bounds (pure, no I/O)."""
from __future__ import annotations

import itertools
import uuid

import pytest

from services.scheduler.domain.inventory import Request
from services.scheduler.domain.queue import FairQueue, QueueFull
from services.scheduler.domain.shapes import STANDARD_SHAPES as S

_tick = itertools.count(1)


def req(tenant, shape="vm.1gpu", priority=0) -> Request:
    return Request(uuid.uuid4(), tenant, S[shape], priority=priority, enqueued_at=float(next(_tick)))


def test_requests_of_one_tenant_come_out_in_fifo_order():
    q, t = FairQueue(), uuid.uuid4()
    rs = [req(t) for _ in range(5)]
    for r in rs:
        q.push(r)
    assert list(q.order({})) == rs


def test_a_flooding_tenant_cannot_delay_another_tenants_request():
    q, a, b = FairQueue(max_per_tenant=1000), uuid.uuid4(), uuid.uuid4()
    for _ in range(1000):
        q.push(req(a))
    late = req(b)
    q.push(late)
    order = list(q.order({a: 64, b: 0}))
    assert order.index(late) == 0           # b uses less: its request goes first
    order = list(q.order({a: 0, b: 0}))
    assert order.index(late) <= 1           # equal use: b waits for at most one of a's


def test_turns_alternate_by_gpus_granted_in_the_pass():
    q, a, b = FairQueue(), uuid.uuid4(), uuid.uuid4()
    a_reqs = [req(a, "vm.4gpu") for _ in range(3)]
    b_reqs = [req(b, "vm.1gpu") for _ in range(8)]
    for r in a_reqs + b_reqs:
        q.push(r)
    order = list(q.order({}))
    # after a's 4-GPU request, b gets four 1-GPU turns before a's next one
    assert [r.tenant_id for r in order[:6]] == [a, b, b, b, b, a]


def test_a_higher_priority_class_goes_before_any_lower_one():
    q, a, b = FairQueue(), uuid.uuid4(), uuid.uuid4()
    low = [req(a) for _ in range(3)]
    high = req(b, priority=5)
    for r in low:
        q.push(r)
    q.push(high)
    assert next(q.order({b: 10_000})) == high


def test_weights_give_a_tenant_a_proportionally_larger_share():
    q, a, b = FairQueue(), uuid.uuid4(), uuid.uuid4()
    q.set_weight(a, 4.0)
    ra, rb = req(a), req(b)
    q.push(rb)
    q.push(ra)
    assert next(q.order({a: 12, b: 4})) == ra     # 12/4 = 3 < 4/1


def test_the_pending_queue_is_bounded_per_tenant_without_affecting_others():
    q, a, b = FairQueue(max_per_tenant=3), uuid.uuid4(), uuid.uuid4()
    for _ in range(3):
        q.push(req(a))
    with pytest.raises(QueueFull) as exc:
        q.push(req(a))
    assert exc.value.limit == 3 and str(a) in str(exc.value)
    q.push(req(b))
    assert q.pending() == {a: 3, b: 1}


def test_cancel_removes_a_pending_request_once_and_frees_its_place_in_the_bound():
    q, a = FairQueue(max_per_tenant=2), uuid.uuid4()
    r1, r2 = req(a), req(a)
    q.push(r1)
    q.push(r2)
    assert q.cancel(r1.allocation_id) == r1 and q.cancel(r1.allocation_id) is None
    q.push(req(a))
    assert len(q) == 2 and r1.allocation_id not in q


def test_requests_cancelled_during_iteration_are_skipped():
    q, a = FairQueue(), uuid.uuid4()
    rs = [req(a) for _ in range(3)]
    for r in rs:
        q.push(r)
    it = q.order({})
    assert next(it) == rs[0]
    q.cancel(rs[1].allocation_id)
    assert list(it) == [rs[2]]


def test_pushing_the_same_request_twice_keeps_one():
    q, r = FairQueue(), req(uuid.uuid4())
    q.push(r)
    q.push(r)
    assert len(q) == 1 and list(q.kinds().values()) == [r]


def test_ranked_lists_only_the_asked_kinds_and_tenant_in_fair_order():
    q, a, b = FairQueue(), uuid.uuid4(), uuid.uuid4()
    big_a, small_b, big_b = req(a, "vm.8gpu"), req(b), req(b, "vm.8gpu")
    for r in (big_a, small_b, big_b):
        q.push(r)
    kind = next(k for k, r in q.kinds().items() if r.shape.gpu_count == 8)
    assert q.ranked({a: 16, b: 0}, [kind]) == [big_b, big_a]
    assert q.ranked({}, [], tenant=b) == [small_b, big_b]
