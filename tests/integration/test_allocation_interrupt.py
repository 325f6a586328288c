"""An interrupted allocation against real NATS JetStream and PostgreSQL: interrupt → INTERRUPTED (the row keeps the
interruption), the reschedule's activate → ACTIVE on the new node with allocation.rescheduled beside the step's
reply (once, however often the step is delivered), and past the retry policy's bound → FAILED."""
from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from shared.wire import step_key
from tests.integration.test_allocation import activated, emitted, row, started, step_cmd
from tests.support.bus import of, wait_handled
from tests.support.bus import send_command as send


def interrupt_cmd(alloc: uuid.UUID, tenant: uuid.UUID, node: uuid.UUID, lost: datetime, **overrides) -> dict:
    return {"allocation_id": alloc, "tenant_id": tenant, "node_id": node, "category": "node_lost",
            "reason": "node n1 stopped answering heartbeats", "interrupted_at": lost.isoformat(),
            "next": "it is being placed on another node", **overrides}


async def test_interrupt_then_the_reschedules_activate_brings_it_back_on_a_new_node_once(run_service, nc, watch):
    rt, js, events = await started(run_service, nc, watch)
    alloc, tenant = uuid.uuid4(), uuid.uuid4()
    node = await activated(js, events, alloc, tenant)
    lost = datetime.now(UTC) - timedelta(seconds=20)
    await send(js, "allocation.interrupt", interrupt_cmd(alloc, tenant, node, lost))
    [hit] = await events.wait_for(of(alloc, "allocation.interrupted"))
    data = hit[1]["data"]
    assert (data["state"], data["node_id"], data["attempt"], data["shape"], data["labels"]) == (
        "INTERRUPTED", str(node), 1, "vm.2gpu", {"team": "ml"})
    r = await row(rt, alloc)
    assert (r["state"], r["node_id"], r["interrupted_at"], r["interrupt_category"], r["reschedules"]) == (
        "INTERRUPTED", node, lost, "node_lost", 1)

    # a release the tenant asks meanwhile waits for the move: kept, nothing rejected
    owner = uuid.uuid4()
    _, seq = await send(js, "allocation.release", {"allocation_id": alloc, "tenant_id": tenant, "requested_by": owner})
    await wait_handled(js, "allocation", "allocation.release", seq)
    r = await row(rt, alloc)
    assert (r["state"], r["release_pending"], r["release_pending_by"]) == ("INTERRUPTED", True, owner)

    saga, new_node = uuid.uuid4(), uuid.uuid4()
    activate = step_cmd(alloc, tenant, saga, "activate", node_id=new_node)
    env, _ = await send(js, "allocation.activate", activate)
    _, seq = await send(js, "allocation.activate", {}, env=env, msg_id=f"again-{env.id}")
    [resched] = await events.wait_for(of(alloc, "allocation.rescheduled"))
    await wait_handled(js, "allocation", "allocation.activate", seq)
    data = resched[1]["data"]
    assert (data["state"], data["from_node_id"], data["to_node_id"], data["attempt"]) == (
        "ACTIVE", str(node), str(new_node), 1)
    assert data["gap_s"] >= 20
    [released] = await events.wait_for(of(alloc, "allocation.release_requested"))   # and then the waiting release
    assert (released[1]["data"]["requested_by"], released[1]["data"]["node_id"]) == (str(owner), str(new_node))
    r = await row(rt, alloc)
    assert (r["state"], r["node_id"], r["interrupted_at"], r["release_pending"]) == ("RELEASING", new_node, lost, False)
    assert await emitted(rt, alloc, "allocation.command_rejected") == 0
    assert await emitted(rt, alloc, "allocation.rescheduled") == 1
    assert await emitted(rt, alloc, "allocation.activated") == 2   # the first activation and the reschedule's
    async with rt.pool.acquire() as conn:
        assert await conn.fetchval("SELECT status FROM step_outcomes WHERE idempotency_key=$1",
                                   step_key(saga, "activate")) == "done"


async def test_an_interrupt_past_the_bound_fails_the_allocation_and_a_stale_one_changes_nothing(run_service, nc, watch):
    rt, js, events = await started(run_service, nc, watch)
    alloc, tenant = uuid.uuid4(), uuid.uuid4()
    node = await activated(js, events, alloc, tenant)
    async with rt.pool.acquire() as conn:
        await conn.execute("UPDATE allocations SET reschedules = 3 WHERE id=$1", alloc)
    lost = datetime.now(UTC) - timedelta(seconds=5)
    _, seq = await send(js, "allocation.interrupt", interrupt_cmd(alloc, tenant, uuid.uuid4(), lost))   # stale
    await wait_handled(js, "allocation", "allocation.interrupt", seq)
    assert (await row(rt, alloc))["state"] == "ACTIVE"
    await send(js, "allocation.interrupt", interrupt_cmd(alloc, tenant, node, lost, category="gpu_fault"))
    [hit] = await events.wait_for(of(alloc, "allocation.failed"))
    assert hit[1]["data"]["failed_step"] == "reschedule" and "gpu_fault" in hit[1]["data"]["reason"]
    r = await row(rt, alloc)
    assert (r["state"], r["failed_step"], r["interrupt_category"], r["reschedules"]) == (
        "FAILED", "reschedule", "gpu_fault", 3)
    assert await emitted(rt, alloc, "allocation.interrupted") == 0
