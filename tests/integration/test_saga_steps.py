"""An allocation's saga timeline (saga.read_steps) against real NATS and PostgreSQL: the coordinator runs
in-process, the test plays every participant and asks as the gateway does (its own bus identity)."""
from __future__ import annotations

import uuid
from functools import partial

from services.saga.bootstrap import build
from services.saga.contracts import AllocationSagas, ReadSteps
from shared import rpc
from shared.contract import load_catalog
from tests.integration.test_saga import ALLOCATE_ORDER, SHORT_STEP, Participants

ALLOCATE_STEPS = ["reserve_slots", "attach_network", "provision_volume", "provision_node", "bind_port", "activate"]
SKIPPED = {"bind_port"}   # a VM has no switch port to move: skipped (succeeded, attempt 0, 0 s)


async def read_steps(connect, allocation_id) -> AllocationSagas:
    gateway, _ = await connect("gateway")
    return await rpc.request(gateway, load_catalog(), "gateway", "saga.read_steps",
                             ReadSteps(allocation_id=allocation_id), timeout=10)


def assert_non_decreasing(saga) -> None:
    """Each record starts no earlier than its saga and finishes no earlier than it started; the saga finishes
    no earlier than any of its records."""
    for s in saga.steps:
        if s.started_at is not None:
            assert s.started_at >= saga.started_at, s
        if s.finished_at is not None:
            assert s.started_at is not None and s.finished_at >= s.started_at, s
            assert s.duration_s == round((s.finished_at - s.started_at).total_seconds(), 6)
            assert saga.finished_at is None or saga.finished_at >= s.finished_at, s


async def test_a_completed_allocate_saga_reads_as_its_steps_in_order_each_timed(run_service, watch, nc, connect):
    await run_service("saga", build)
    p = await Participants.start(watch, nc)
    await p.request()
    for type_ in ALLOCATE_ORDER[:2]:
        await p.succeed(await p.command(type_))
    await p.command(ALLOCATE_ORDER[2])
    running = (await read_steps(connect, p.allocation_id)).items[0]
    invoked = [s for s in running.steps if s.phase == "invoke"]
    assert running.state == "running" and running.finished_at is None
    assert [(s.step, s.status) for s in invoked] == [("reserve_slots", "succeeded"), ("attach_network", "succeeded"),
                                                     ("provision_volume", "invoked")]
    assert invoked[-1].started_at is not None and invoked[-1].duration_s is None   # still running
    for type_ in ALLOCATE_ORDER[2:]:
        await p.succeed(await p.command(type_))
    await p.event("saga.completed")
    [saga] = (await read_steps(connect, p.allocation_id)).items
    assert (saga.kind, saga.state) == ("allocate", "completed") and saga.finished_at is not None
    invoked = [s for s in saga.steps if s.phase == "invoke"]
    assert [s.step for s in invoked] == ALLOCATE_STEPS
    assert all(s.status == "succeeded" and s.attempt == (0 if s.step in SKIPPED else 1) and s.duration_s is not None
               for s in invoked)
    assert next(s for s in invoked if s.step == "bind_port").duration_s == 0
    assert [s.started_at for s in invoked] == sorted(s.started_at for s in invoked)
    undos = [s for s in saga.steps if s.phase == "compensate"]
    assert undos and all(s.status == "armed" and s.started_at is None for s in undos)   # never needed
    assert_non_decreasing(saga)


async def test_a_timed_out_step_shows_with_its_compensations_and_the_release_follows(run_service, watch, nc, connect):
    await run_service("saga", partial(build, saga=SHORT_STEP))
    p = await Participants.start(watch, nc)
    await p.request()
    await p.succeed(await p.command("scheduler.reserve_slots"))
    await p.command("network.attach_network")                     # never answered: times out
    await p.succeed(await p.command("network.detach_network", timeout=10))
    await p.succeed(await p.command("scheduler.release_slots"))
    await p.event("saga.failed")
    [saga] = (await read_steps(connect, p.allocation_id)).items
    rows = [(s.step, s.phase, s.status) for s in saga.steps if s.status not in ("armed",)]
    assert rows == [("reserve_slots", "invoke", "succeeded"), ("reserve_slots", "compensate", "compensated"),
                    ("attach_network", "invoke", "timed_out"), ("attach_network", "compensate", "compensated")]
    attach = next(s for s in saga.steps if (s.step, s.phase) == ("attach_network", "invoke"))
    assert attach.error == "timed out after 1.5s" and attach.duration_s >= 1.5
    assert saga.state == "failed" and saga.finished_at is not None
    assert_non_decreasing(saga)

    await p.request_release(p.node_id)                           # the release saga comes after it
    await p.command("billing.stop_meter")
    sagas = (await read_steps(connect, p.allocation_id)).items
    assert [(s.kind, s.state) for s in sagas] == [("allocate", "failed"), ("release", "running")]
    assert sagas[1].started_at >= sagas[0].started_at


async def test_an_allocation_without_sagas_reads_as_none(run_service, connect):
    await run_service("saga", build)
    assert (await read_steps(connect, uuid.uuid4())).items == []
