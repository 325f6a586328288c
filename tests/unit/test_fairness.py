"""The fair picker of a consumer's window (shared.fairness): weighted deficit round robin over the tenants with
messages waiting, FIFO within a tenant, no credit for idling; and how a message's headers name its line."""
from __future__ import annotations

import uuid

from shared.envelope import Envelope, utcnow
from shared.fairness import NO_TENANT, FairQueue, TenantWeights, clamp_weight, line_of


def queue_of(*lines: tuple[str, int, int]) -> FairQueue[str]:
    """A queue holding, for each (line, count, weight), ``count`` items named line + index."""
    q: FairQueue[str] = FairQueue()
    for line, count, weight in lines:
        for i in range(count):
            q.put(line, f"{line}{i}", weight)
    return q


def test_a_burst_and_a_single_message_are_served_alternately():
    q = queue_of(("a", 5, 1))
    q.put("b", "b0")
    assert q.take(4) == ["a0", "b0", "a1", "a2"]
    assert q.take(10) == ["a3", "a4"] and len(q) == 0


def test_weights_set_the_share_while_both_wait():
    q = queue_of(("a", 30, 3), ("b", 30, 1))
    first = q.take(20)
    assert sum(x.startswith("a") for x in first) == 15 and sum(x.startswith("b") for x in first) == 5


def test_a_line_cut_short_by_the_batch_keeps_its_credit_and_goes_first():
    q = queue_of(("a", 10, 4), ("b", 10, 1))
    assert q.take(2) == ["a0", "a1"]
    assert q.take(3) == ["a2", "a3", "b0"]
    assert q.take(5) == ["a4", "a5", "a6", "a7", "b1"]


def test_order_within_a_line_is_kept_and_every_item_is_taken_once():
    q = queue_of(("a", 7, 2), ("b", 5, 1), ("c", 3, 5))
    taken = []
    while len(q):
        taken += q.take(3)
    assert len(taken) == 15 and set(taken) == {f"{x}{i}" for x, n in (("a", 7), ("b", 5), ("c", 3)) for i in range(n)}
    for line in "abc":
        mine = [x for x in taken if x.startswith(line)]
        assert mine == sorted(mine, key=lambda x: int(x[1:]))


def test_an_idle_line_earns_no_credit():
    q = queue_of(("a", 1, 1))
    assert q.take(5) == ["a0"]   # a's line emptied: it leaves the round with nothing kept
    for i in range(4):
        q.put("b", f"b{i}")
    q.put("a", "a1")
    assert q.take(3) == ["b0", "a1", "b1"]


def test_a_new_line_joins_at_the_end_of_the_round():
    q = queue_of(("a", 3, 1), ("b", 3, 1))
    assert q.take(1) == ["a0"]
    q.put("c", "c0")
    assert q.take(4) == ["b0", "a1", "c0", "b1"]


def test_drain_empties_the_queue():
    q = queue_of(("a", 3, 1), ("b", 2, 1))
    assert sorted(q.drain()) == ["a0", "a1", "a2", "b0", "b1"]
    assert len(q) == 0 and q.take(5) == []


def test_a_weight_is_an_integer_between_1_and_100_and_anything_else_the_default():
    assert [clamp_weight(w) for w in (0, -3, 1, 7, "12", 1000, "x", None, 2.9)] == [1, 1, 1, 7, 12, 100, 1, 1, 1]


def test_the_envelope_headers_name_the_tenant_and_its_weight():
    tenant = uuid.uuid4()
    env = Envelope(id=uuid.uuid4(), type="t.x", schema_version=1, occurred_at=utcnow(), tenant_id=tenant,
                   weight=4, correlation_id="c", data={})
    assert line_of(env.headers()) == (str(tenant), 4)
    bare = env.model_copy(update={"tenant_id": None, "weight": None})
    assert line_of(bare.headers()) == (NO_TENANT, 1) and line_of(None) == (NO_TENANT, 1)


def test_the_process_weights_stamp_only_what_is_not_the_default():
    weights, t1, t2 = TenantWeights(), uuid.uuid4(), uuid.uuid4()
    weights.replace({t1: 3, t2: 1})
    assert (weights.get(t1), weights.get(t2), weights.get(None), weights.get(uuid.uuid4())) == (3, None, None, None)
    weights.set(t2, 5)
    assert weights.get(t2) == 5


def test_a_message_inherits_its_causes_weight_and_the_process_stamps_a_new_tenants(monkeypatch):
    from pydantic import BaseModel

    from shared import fairness
    from shared.contract import Catalog, Message, ServiceContract
    from shared.outbox import Outbox

    class Ping(BaseModel):
        n: int

    contract = ServiceContract(service="fairprobe", title="t", description="d",
                               messages=[Message("fairprobe.ping", "fairprobe.cmd.ping", Ping, "command", "ping")])
    outbox, tenant, other = Outbox("fairprobe", Catalog([contract])), uuid.uuid4(), uuid.uuid4()
    weights = TenantWeights()
    weights.set(tenant, 6)
    monkeypatch.setattr(fairness, "weights", weights)
    stamped = outbox.envelope("fairprobe.ping", Ping(n=1), correlation_id="c", tenant_id=tenant, causation=None)
    assert stamped.weight == 6
    weights.set(tenant, 2)   # a cause's weight wins over what the process knows now: the saga keeps its share
    caused = outbox.envelope("fairprobe.ping", Ping(n=2), correlation_id="c", tenant_id=None, causation=stamped)
    assert (caused.tenant_id, caused.weight) == (tenant, 6)
    elsewhere = outbox.envelope("fairprobe.ping", Ping(n=3), correlation_id="c", tenant_id=other, causation=stamped)
    assert (elsewhere.tenant_id, elsewhere.weight) == (other, None)


def test_a_batch_holds_what_the_round_served_grouped_by_line_in_one_order():
    q, same = queue_of(("b", 3, 1), ("a", 3, 1)), queue_of(("b", 3, 1), ("a", 3, 1))
    assert same.take(4) == ["b0", "a0", "b1", "a1"]          # the order served
    assert q.take_batch(4) == ["a0", "a1", "b0", "b1"]       # the same items, a's line first, each in order
    assert q.take_batch(4) == ["a2", "b2"] and same.take(4) == ["b2", "a2"]
