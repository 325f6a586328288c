"""Pure parts of the shared kit: envelope, fault labels, DSNs, stream declarations, periodic loops."""
from __future__ import annotations

import asyncio
import contextlib
import uuid

import pytest
from pydantic import ValidationError

from shared.db import in_list, role_name, service_dsn
from shared.envelope import Envelope, utcnow
from shared.participant import FAULT_LABEL, injected_fault
from shared.periodic import Leadership, periodic
from shared.streams import DEAD_LETTER_STREAM, stream_configs
from shared.wire import StepCommand, step_key
from tests.support.polling import eventually


def cmd(step: str, labels: dict[str, str]) -> StepCommand:
    s = uuid.uuid4()
    return StepCommand(saga_id=s, step=step, idempotency_key=step_key(s, step), allocation_id=uuid.uuid4(),
                       tenant_id=uuid.uuid4(), labels=labels)


def test_envelope_headers_carry_message_id_type_and_trace_context():
    env = Envelope(id=uuid.uuid4(), type="billing.meter_started", schema_version=1, occurred_at=utcnow(),
                   correlation_id="a", traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01", data={})
    h = env.headers()
    assert h["Nats-Msg-Id"] == str(env.id) and h["Tessera-Type"] == env.type and h["traceparent"] == env.traceparent


def test_envelope_rejects_unknown_fields():
    with pytest.raises(ValidationError):
        Envelope.model_validate({"id": str(uuid.uuid4()), "type": "x", "schema_version": 1, "occurred_at": "2026-01-01T00:00:00Z",
                                 "correlation_id": "c", "data": {}, "sneaky": 1})


def test_fault_label_applies_only_to_its_step_and_only_when_enabled():
    labels = {FAULT_LABEL: "attach_network=fail, provision_node=timeout"}
    assert injected_fault(cmd("attach_network", labels), enabled=True) == "fail"
    assert injected_fault(cmd("provision_node", labels), enabled=True) == "timeout"
    assert injected_fault(cmd("reserve_slots", labels), enabled=True) is None
    assert injected_fault(cmd("attach_network", labels), enabled=False) is None
    assert injected_fault(cmd("attach_network", {FAULT_LABEL: "attach_network=explode"}), enabled=True) is None


def test_service_dsn_swaps_in_the_services_own_role():
    dsn = service_dsn("postgresql://postgres:pw@127.0.0.1:5432/tessera", "billing", "s3cret")
    assert dsn.startswith(f"postgresql://{role_name('billing')}:") and dsn.endswith("@127.0.0.1:5432/tessera")
    assert "pw@" not in dsn


def test_a_constants_values_are_written_as_one_sql_list_and_anything_else_is_refused():
    assert in_list({"running", "compensating"}) == "('compensating', 'running')"
    assert in_list(("in-use", "RUNNING", "in-use")) == "('RUNNING', 'in-use')"
    for bad in ([], ["it's"], ["a b"], ["x'); DROP TABLE t; --"], ["é"]):
        with pytest.raises(ValueError):
            in_list(bad)


def test_every_stream_is_file_backed_with_a_duplicate_window():
    configs = stream_configs()
    assert DEAD_LETTER_STREAM in {c.name for c in configs}
    for c in configs:
        assert c.storage.value == "file" and c.duplicate_window >= 60


def test_a_bad_setting_is_refused_naming_the_variable(monkeypatch):
    from shared.settings import ServiceSettings

    for name, value in [("TESSERA_HTTP_PORT", "eighty"), ("TESSERA_MAX_DELIVER", "0"),
                        ("TESSERA_RETRY_BACKOFF_S", "1,-2"), ("TESSERA_ACK_WAIT_S", "soon")]:
        with monkeypatch.context() as m:
            m.setenv(name, value)
            with pytest.raises(ValueError, match=name):
                ServiceSettings.from_env("billing")


@contextlib.asynccontextmanager
async def running(loop):
    """Run ``loop`` for the block, then cancel it as a stop does."""
    task = asyncio.create_task(loop())
    try:
        yield task
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_periodic_step_that_raises_is_logged_and_the_next_one_runs_on_time():
    calls = []

    async def step():
        calls.append(len(calls))
        if len(calls) == 1:
            raise RuntimeError("first round fails")
    async with running(periodic(0.01, step, at_once=True)):
        await eventually(lambda: len(calls) >= 3, timeout=5, what="the rounds after the failed one")


async def first_step_after(*, at_once: bool, period: float) -> float:
    """Seconds from a periodic loop's start to its step's first run."""
    clock, ran = asyncio.get_running_loop(), asyncio.Event()

    async def step():
        ran.set()
    started = clock.time()
    async with running(periodic(period, step, at_once=at_once)):
        await asyncio.wait_for(ran.wait(), 5)
    return clock.time() - started


async def test_a_periodic_step_runs_first_after_one_period_unless_at_once():
    assert await first_step_after(at_once=False, period=0.5) >= 0.5
    assert await first_step_after(at_once=True, period=30) < 30


async def test_a_leader_only_step_runs_only_while_its_replica_leads():
    lead, led, periods = Leadership("probe", lease=None), [], []

    async def step():
        led.append(lead.leading.is_set())

    async def tick():
        periods.append(1)

    async def some_periods(n: int = 5):
        seen = len(periods)
        await eventually(lambda: len(periods) >= seen + n, timeout=5, what=f"{n} periods")
    async with running(periodic(0.01, step, leadership=lead)), running(periodic(0.01, tick)):
        await some_periods()
        assert led == []
        lead.leading.set()
        await eventually(lambda: len(led) >= 2, timeout=5, what="steps while leading")
        lead.leading.clear()
        ran = len(led)
        await some_periods()
        assert len(led) == ran and all(led)


async def test_a_leadership_without_election_leads_at_once_and_steps_down_in_reverse_order_when_stopped():
    lead, said = Leadership("probe", lease=None), []
    for name in ("index", "consumers"):
        async def gain(name=name):
            said.append(f"gain {name}")

        async def lose(name=name):
            said.append(f"lose {name}")
        lead.on_gain(gain)
        lead.on_lose(lose)
    task = asyncio.create_task(lead.run())
    await asyncio.wait_for(lead.leading.wait(), 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not lead.leading.is_set()
    assert said == ["gain index", "gain consumers", "lose consumers", "lose index"]


def test_a_leadership_is_named_after_its_service():
    from shared.runtime import Runtime
    from shared.settings import ServiceSettings

    rt = Runtime(ServiceSettings(service="billing", db_dsn="postgresql://127.0.0.1/x"))
    assert rt.leader("billing") is rt.leader("billing") and rt.leader("billing.invoices").name == "billing.invoices"
    with pytest.raises(ValueError, match="storage"):
        rt.leader("storage")
    with pytest.raises(ValueError, match="election"):
        rt.leader("billing", elect=False)


async def test_a_stop_cancels_again_a_task_that_swallowed_its_cancellation():
    """3.11's asyncio.wait_for may drop a cancellation when its awaitable completes at that moment: the task
    goes on, and a stop that awaited it once would wait forever."""
    from shared.runtime import _cancel_all

    started, swallowed, never = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def swallows_once():
        started.set()
        try:
            await never.wait()
        except asyncio.CancelledError:
            swallowed.set()           # as wait_for does: the cancellation is lost, the loop goes on
        await never.wait()

    task = asyncio.create_task(swallows_once())
    await started.wait()
    await _cancel_all([task], grace_s=5, every_s=0.05)
    assert swallowed.is_set() and task.cancelled()


async def test_a_stop_gives_up_on_a_task_that_never_ends_and_names_it():
    from shared.runtime import _cancel_all

    started, release = asyncio.Event(), asyncio.Event()

    async def never_ends():
        started.set()
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue

    task = asyncio.create_task(never_ends(), name="stubborn")
    await started.wait()
    try:
        stragglers = await _cancel_all([task], grace_s=0.2, every_s=0.05)
        assert not task.done()
        assert [t.get_name() for t in stragglers] == ["stubborn"]
    finally:
        release.set()
        task.cancel()
        await asyncio.wait([task])


async def test_a_stop_that_cancels_again_lets_the_step_down_finish():
    """A lose hook that waits (a leader-only subscriber's batches in flight) is not cut short by the stop's
    repeated cancellations: every hook runs, then the leadership's task ends cancelled."""
    from shared.runtime import _cancel_all

    lead, said = Leadership("probe", lease=None), []
    stepping_down, batch_done = asyncio.Event(), asyncio.Event()

    async def unload():
        said.append("unload")

    async def stop_consumers():
        stepping_down.set()
        await batch_done.wait()
        said.append("consumers stopped")
    lead.on_lose(unload)
    lead.on_lose(stop_consumers)
    task = asyncio.create_task(lead.run())
    await asyncio.wait_for(lead.leading.wait(), 5)
    stop = asyncio.create_task(_cancel_all([task], grace_s=10, every_s=0.01))
    await asyncio.wait_for(stepping_down.wait(), 5)
    await eventually(task.cancelling, until=lambda n: n >= 3, timeout=5, what="the stop to cancel again")
    batch_done.set()
    assert await stop == set()
    assert task.cancelled() and said == ["consumers stopped", "unload"]
