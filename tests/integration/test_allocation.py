"""Allocation against real NATS JetStream and PostgreSQL: commands → events on the stream → rows,
redelivery without a second effect, rejections, and dead-lettering of malformed commands."""
from __future__ import annotations

import uuid

from services.allocation.bootstrap import build
from shared.wire import step_key
from tests.support.bus import of, send_malformed_then_valid, wait_handled
from tests.support.bus import send_command as send


def request_cmd(alloc: uuid.UUID, tenant: uuid.UUID, **overrides) -> dict:
    cmd = {"allocation_id": alloc, "tenant_id": tenant, "user_id": uuid.uuid4(), "name": "train-1", "shape": "vm.2gpu",
           "gpu_count": 2, "volume_gb": 50, "labels": {"team": "ml"}}
    cmd.update(overrides)
    return cmd


def step_cmd(alloc: uuid.UUID, tenant: uuid.UUID, saga: uuid.UUID, step: str, **extra) -> dict:
    return {"saga_id": saga, "step": step, "idempotency_key": step_key(saga, step), "allocation_id": alloc,
            "tenant_id": tenant, **extra}


async def row(rt, alloc: uuid.UUID):
    async with rt.pool.acquire() as conn:
        return await conn.fetchrow("SELECT * FROM allocations WHERE id=$1", alloc)


async def emitted(rt, alloc: uuid.UUID, type_: str) -> int:
    """How many events of ``type_`` about ``alloc`` the service ever wrote to its outbox."""
    async with rt.pool.acquire() as conn:
        return await conn.fetchval(
            "SELECT count(*) FROM outbox WHERE type=$1 AND convert_from(body, 'UTF8')::jsonb->'data'->>'allocation_id' = $2",
            type_, str(alloc))


async def started(run_service, nc, watch):
    """The allocation service, consuming; returns it, a JetStream context and a watcher on its events."""
    rt = await run_service("allocation", build)
    return rt, nc.jetstream(), await watch("allocation.evt.>")


async def requested(js, events, alloc, tenant) -> None:
    """Request a fresh allocation through the bus and wait until it is REQUESTED."""
    await send(js, "allocation.request", request_cmd(alloc, tenant))
    await events.wait_for(of(alloc, "allocation.requested"))


async def activated(js, events, alloc, tenant) -> uuid.UUID:
    """Drive a fresh allocation to ACTIVE through the bus; returns its node id."""
    saga, node = uuid.uuid4(), uuid.uuid4()
    await requested(js, events, alloc, tenant)
    await send(js, "allocation.activate", step_cmd(alloc, tenant, saga, "activate", node_id=node))
    await events.wait_for(of(alloc, "allocation.activated"))
    return node


async def test_request_delivered_twice_creates_one_requested_allocation_and_one_event(run_service, nc, watch):
    rt, js, events = await started(run_service, nc, watch)
    alloc, tenant = uuid.uuid4(), uuid.uuid4()
    env, _ = await send(js, "allocation.request", request_cmd(alloc, tenant))
    _, seq = await send(js, "allocation.request", {}, env=env, msg_id=f"again-{env.id}")
    [hit] = await events.wait_for(of(alloc, "allocation.requested"))
    await wait_handled(js, "allocation", "allocation.request", seq)
    data = hit[1]["data"]
    assert (data["state"], data["shape"], data["gpu_count"], data["volume_gb"], data["labels"]) == (
        "REQUESTED", "vm.2gpu", 2, 50, {"team": "ml"})
    assert hit[1]["causation_id"] == str(env.id) and hit[1]["tenant_id"] == str(tenant)
    r = await row(rt, alloc)
    assert (r["state"], r["name"], r["node_id"]) == ("REQUESTED", "train-1", None)
    assert await emitted(rt, alloc, "allocation.requested") == 1


async def test_a_second_request_with_an_existing_id_is_a_no_op(run_service, nc, watch):
    rt, js, events = await started(run_service, nc, watch)
    alloc, tenant = uuid.uuid4(), uuid.uuid4()
    await requested(js, events, alloc, tenant)
    _, seq = await send(js, "allocation.request", request_cmd(alloc, tenant, name="other", volume_gb=7))
    await wait_handled(js, "allocation", "allocation.request", seq)
    r = await row(rt, alloc)
    assert (r["name"], r["volume_gb"]) == ("train-1", 50)
    assert await emitted(rt, alloc, "allocation.requested") == 1


async def test_request_with_a_gpu_count_that_does_not_match_the_shape_is_rejected_and_stores_nothing(run_service, nc, watch):
    rt, js, events = await started(run_service, nc, watch)
    alloc = uuid.uuid4()
    await send(js, "allocation.request", request_cmd(alloc, uuid.uuid4(), shape="vm.4gpu", gpu_count=2))
    [hit] = await events.wait_for(of(alloc, "allocation.command_rejected"))
    assert hit[1]["data"]["command"] == "allocation.request" and "vm.4gpu" in hit[1]["data"]["reason"]
    assert await row(rt, alloc) is None


async def test_full_life_cycle_reaches_released_with_release_carrying_node_volume_and_labels(run_service, nc, watch):
    rt, js, events = await started(run_service, nc, watch)
    alloc, tenant, saga, node = uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    await requested(js, events, alloc, tenant)
    await send(js, "allocation.activate", step_cmd(alloc, tenant, saga, "activate", node_id=node))
    [act] = await events.wait_for(of(alloc, "allocation.activated"))
    assert (act[1]["data"]["state"], act[1]["data"]["node_id"]) == ("ACTIVE", str(node))
    assert act[1]["data"]["idempotency_key"] == step_key(saga, "activate")
    await send(js, "allocation.release", {"allocation_id": alloc, "tenant_id": tenant, "requested_by": uuid.uuid4()})
    [rel] = await events.wait_for(of(alloc, "allocation.release_requested"))
    assert (rel[1]["data"]["node_id"], rel[1]["data"]["volume_gb"], rel[1]["data"]["labels"]) == (str(node), 50, {"team": "ml"})
    assert (await row(rt, alloc))["state"] == "RELEASING"
    release_saga = uuid.uuid4()
    await send(js, "allocation.mark_released", step_cmd(alloc, tenant, release_saga, "mark_released"))
    [done] = await events.wait_for(of(alloc, "allocation.released"))
    assert done[1]["data"]["state"] == "RELEASED"
    assert (await row(rt, alloc))["state"] == "RELEASED"


async def test_activate_delivered_twice_activates_once_and_a_repeated_key_gets_the_same_reply(run_service, nc, watch):
    rt, js, events = await started(run_service, nc, watch)
    alloc, tenant, saga, node = uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    await requested(js, events, alloc, tenant)
    env, _ = await send(js, "allocation.activate", step_cmd(alloc, tenant, saga, "activate", node_id=node))
    _, seq = await send(js, "allocation.activate", {}, env=env, msg_id=f"again-{env.id}")
    await events.wait_for(of(alloc, "allocation.activated"))
    await wait_handled(js, "allocation", "allocation.activate", seq)
    assert await emitted(rt, alloc, "allocation.activated") == 1
    first = (await row(rt, alloc))["updated_at"]
    # the coordinator retrying the step: a new envelope, the same key → the recorded reply again, no new effect
    _, seq = await send(js, "allocation.activate", step_cmd(alloc, tenant, saga, "activate", node_id=node))
    await wait_handled(js, "allocation", "allocation.activate", seq)
    assert await emitted(rt, alloc, "allocation.activated") == 2
    assert (await row(rt, alloc))["updated_at"] == first


async def test_activate_of_a_failed_allocation_replies_activation_failed_and_stays_failed(run_service, nc, watch):
    rt, js, events = await started(run_service, nc, watch)
    alloc, tenant, saga = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    await requested(js, events, alloc, tenant)
    await send(js, "allocation.fail", {"allocation_id": alloc, "saga_id": saga, "failed_step": "reserve_slots",
                                       "reason": "no capacity: 2 GPUs"})
    [failed] = await events.wait_for(of(alloc, "allocation.failed"))
    assert (failed[1]["data"]["failed_step"], failed[1]["data"]["state"]) == ("reserve_slots", "FAILED")
    await send(js, "allocation.activate", step_cmd(alloc, tenant, saga, "activate", node_id=uuid.uuid4()))
    [refused] = await events.wait_for(of(alloc, "allocation.activation_failed"))
    assert "FAILED" in refused[1]["data"]["reason"]
    r = await row(rt, alloc)
    assert (r["state"], r["failed_step"], r["reason"], r["node_id"]) == ("FAILED", "reserve_slots", "no capacity: 2 GPUs", None)


async def test_a_release_of_a_requested_allocation_but_a_withdrawal_is_rejected_with_the_reason(run_service, nc, watch):
    """REQUESTED lasts while the allocate saga runs: only the coordinator's withdrawal (no saga ran, none will)
    releases it; any other release could race with the saga."""
    rt, js, events = await started(run_service, nc, watch)
    alloc, tenant = uuid.uuid4(), uuid.uuid4()
    await requested(js, events, alloc, tenant)
    await send(js, "allocation.release", {"allocation_id": alloc, "tenant_id": tenant, "requested_by": uuid.uuid4()})
    [rej] = await events.wait_for(of(alloc, "allocation.command_rejected"))
    assert rej[1]["data"]["command"] == "allocation.release"
    assert "REQUESTED" in rej[1]["data"]["reason"] and "only an ACTIVE allocation" in rej[1]["data"]["reason"]
    assert (await row(rt, alloc))["state"] == "REQUESTED"
    assert await emitted(rt, alloc, "allocation.release_requested") == 0
    await send(js, "allocation.release", {"allocation_id": alloc, "tenant_id": tenant, "requested_by": uuid.uuid4(),
                                          "withdrawn": True})
    [rel] = await events.wait_for(of(alloc, "allocation.release_requested"))
    assert (rel[1]["data"]["state"], rel[1]["data"]["node_id"]) == ("RELEASING", None)
    assert (await row(rt, alloc))["state"] == "RELEASING"


async def test_release_by_another_tenant_is_rejected_and_releasing_twice_is_a_no_op(run_service, nc, watch):
    rt, js, events = await started(run_service, nc, watch)
    alloc, tenant = uuid.uuid4(), uuid.uuid4()
    await activated(js, events, alloc, tenant)
    intruder = uuid.uuid4()
    await send(js, "allocation.release", {"allocation_id": alloc, "tenant_id": intruder, "requested_by": uuid.uuid4()})
    [rej] = await events.wait_for(of(alloc, "allocation.command_rejected"))
    assert str(intruder) in rej[1]["data"]["reason"]
    assert (await row(rt, alloc))["state"] == "ACTIVE"
    for _ in range(2):
        _, seq = await send(js, "allocation.release", {"allocation_id": alloc, "tenant_id": tenant, "requested_by": uuid.uuid4()})
    await wait_handled(js, "allocation", "allocation.release", seq)
    assert (await row(rt, alloc))["state"] == "RELEASING"
    assert await emitted(rt, alloc, "allocation.release_requested") == 1


async def test_mark_released_of_an_active_allocation_replies_the_steps_failure_without_effect(run_service, nc, watch):
    rt, js, events = await started(run_service, nc, watch)
    alloc, tenant = uuid.uuid4(), uuid.uuid4()
    await activated(js, events, alloc, tenant)
    env, _ = await send(js, "allocation.mark_released", step_cmd(alloc, tenant, uuid.uuid4(), "mark_released"))
    [hit] = await events.wait_for(lambda i: i[1].get("causation_id") == str(env.id))
    # no retry can fix it (a PermanentError): the saga hears the step failed at once
    assert hit[1]["type"] == "allocation.release_failed" and "ACTIVE" in hit[1]["data"]["reason"]
    assert (await row(rt, alloc))["state"] == "ACTIVE"


async def test_malformed_request_is_dead_lettered_and_the_next_valid_one_is_still_handled(run_service, nc, watch):
    rt, js, events = await started(run_service, nc, watch)
    bad, good, tenant = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    dead = await send_malformed_then_valid(js, watch, "allocation.request", request_cmd(bad, tenant), "shape",
                                           request_cmd(good, tenant))
    assert dead == "deadletter.allocation.allocation__allocation_request"
    await events.wait_for(of(good, "allocation.requested"))
    assert await row(rt, bad) is None
    assert (await row(rt, good))["state"] == "REQUESTED"
