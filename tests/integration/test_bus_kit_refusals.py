"""The bus kit's refusals against real JetStream and PostgreSQL: a handler error no retry can fix (invalid data
PostgreSQL refuses, an unknown reference, a failed validation, PermanentError) is handled once, never retried.
With ``on_refused`` the refusal is published in a new unit of work (the handler's rolled back) and a redelivery
has no second effect; without it the message is dead-lettered at once. A transient error is still retried.
A saga participant's step whose action meets such an error replies the step's failure (shared.participant).

A probe service of its own (contract, stream, schema) exercises the kit without any real service's logic.
"""
from __future__ import annotations

import uuid

import pytest
from nats.js.api import StreamConfig
from pydantic import BaseModel, ConfigDict, Field

from shared import participant
from shared.contract import Message, ServiceContract
from shared.envelope import Envelope
from shared.participant import StepRejected
from shared.refusals import PermanentError
from shared.steps import Step
from shared.wire import StepCommand, StepFailure, StepReply, step_key
from tests.support.bus import caused_by, make_envelope, probe_runtime, wait_acked

STREAM = "TESSERA_KITPROBE"


class Store(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n: int
    text: str = ""
    mode: str = "ok"


class Stored(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n: int


class Refused(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n: int
    reason: str


class Strict(BaseModel):
    count: int = Field(ge=0)


class DoStep(StepCommand):
    label: str


class StepDone(StepReply):
    item: int


STEP = Step.declare("kitprobe", command=("do_step", DoStep, "Saga step: store a label."),
                    ok=("step_done", StepDone, "Stored."), failed=("step_failed", StepFailure, "Not stored."))
# the same, run optimistically (participant.invoke(optimistic=True)): no savepoint in the kit's first run
QUICK = Step.declare("kitprobe", command=("do_quickly", DoStep, "Saga step: store a label, no savepoint first."),
                     ok=("done_quickly", StepDone, "Stored."), failed=("refused_quickly", StepFailure, "Not stored."))

KITPROBE = ServiceContract(
    service="kitprobe", title="kitprobe", description="test-only service",
    messages=[Message("kitprobe.store", "kitprobe.cmd.store", Store, "command", "store"),
              Message("kitprobe.store_quietly", "kitprobe.cmd.store_quietly", Store, "command", "store, no callback"),
              Message("kitprobe.stored", "kitprobe.evt.stored", Stored, "event", "stored"),
              Message("kitprobe.refused", "kitprobe.evt.refused", Refused, "event", "refused")],
    receives=["kitprobe.store", "kitprobe.store_quietly"],
    steps=[STEP, QUICK],
)

# mode -> (the statement the handler runs, its arguments): each fails with what its mode names
FAILING = {
    "nul": ("INSERT INTO kit_items (label) VALUES ($1)", ("a\x00b",)),                 # CharacterNotInRepertoire
    "too_long": ("INSERT INTO kit_items (label) VALUES ($1)", ("x" * 40,)),            # StringDataRightTruncation
    "out_of_range": ("SELECT $1::int * 1000000", (1_000_000,)),                         # NumericValueOutOfRange
    "bad_text": ("SELECT $1::text::int", ("twelve",)),                                  # InvalidTextRepresentation
    "nul_json": ("SELECT $1::jsonb", ('{"a": "\\u0000"}',)),                           # UntranslatableCharacter
    "unknown_ref": ("INSERT INTO kit_children (parent) VALUES ($1)", (424242,)),        # ForeignKeyViolation
}


@pytest.fixture
async def kitprobe(infra, provision, nc):
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name=STREAM, subjects=["kitprobe.>"], duplicate_window=120))
    await js.purge_stream(STREAM)
    attempts: dict[int, int] = {}
    rt = probe_runtime(KITPROBE, infra.nats_url, await provision("kitprobe"), nkey_file=infra.nkey_file("admin"), max_workers=2)

    async def store(ctx, cmd: Store):
        attempts[cmd.n] = attempts.get(cmd.n, 0) + 1
        await ctx.emit("kitprobe.stored", Stored(n=cmd.n))        # rolled back with the handler when it fails
        if cmd.mode in FAILING:
            sql, args = FAILING[cmd.mode]
            await ctx.conn.execute("INSERT INTO kit_items (label) VALUES ('written before the failure')")
            await ctx.conn.fetchval(sql, *args)
        elif cmd.mode == "invalid":
            Strict(count=-1)
        elif cmd.mode == "permanent":
            raise PermanentError(f"item {cmd.n} can never be stored")
        elif cmd.mode == "flaky" and attempts[cmd.n] == 1:
            raise ConnectionError("the first try meets a lost connection")

    refusals: dict[int, int] = {}

    async def refused(ctx, cmd: Store, reason: str):
        refusals[cmd.n] = refusals.get(cmd.n, 0) + 1
        if cmd.text == "refusal-flaky" and refusals[cmd.n] == 1:
            raise ConnectionError("publishing the refusal meets a lost connection")
        await ctx.emit("kitprobe.refused", Refused(n=cmd.n, reason=reason))

    rt.consumers.subscribe("kitprobe.store", store, on_refused=refused)
    rt.consumers.subscribe("kitprobe.store_quietly", store)

    async def store_label(conn, cmd: DoStep) -> dict:
        attempts[cmd.label] = attempts.get(cmd.label, 0) + 1
        if cmd.label == "flaky" and attempts[cmd.label] == 1:
            raise ConnectionError("the first try meets a lost connection")
        return {"item": await conn.fetchval("INSERT INTO kit_items (label) VALUES ($1) RETURNING id", cmd.label)}

    async def do_step(ctx, cmd: DoStep):
        await participant.invoke(ctx, cmd, store_label, step=STEP)

    rt.consumers.participate(STEP, invoke=do_step)

    async def store_or_refuse(conn, cmd: DoStep) -> dict:
        attempts[cmd.label] = attempts.get(cmd.label, 0) + 1
        item = await conn.fetchval("INSERT INTO kit_items (label) VALUES ($1) RETURNING id", cmd.label)
        if cmd.label.startswith("refuse"):
            raise StepRejected("refused after writing")      # what it wrote must not stay
        return {"item": item}

    async def do_quickly(ctx, cmd: DoStep):
        await participant.invoke(ctx, cmd, store_or_refuse, step=QUICK, optimistic=True)

    rt.consumers.participate(QUICK, invoke=do_quickly)
    await rt.start()
    async with rt.pool.acquire() as conn:
        await conn.execute("CREATE TABLE IF NOT EXISTS kit_items (id bigserial PRIMARY KEY, label varchar(32) NOT NULL);"
                           "CREATE TABLE IF NOT EXISTS kit_parents (id int PRIMARY KEY);"
                           "CREATE TABLE IF NOT EXISTS kit_children (parent int NOT NULL REFERENCES kit_parents (id))")
    rt.attempts, rt.refusals = attempts, refusals
    yield rt
    await rt.stop()


async def send_command(js, type_: str, data: dict, *, env: Envelope | None = None,
                       msg_id: str | None = None) -> tuple[Envelope, int]:
    """Publish on the probe's contract subject (``env`` again under another Nats-Msg-Id: a redelivery)."""
    env = env or make_envelope(type_, data)
    headers = env.headers() | ({"Nats-Msg-Id": msg_id} if msg_id else {})
    ack = await js.publish(KITPROBE.messages[[m.type for m in KITPROBE.messages].index(type_)].subject,
                           env.model_dump_json().encode(), headers=headers)
    return env, ack.seq


def number() -> int:
    return uuid.uuid4().int % 10**9


async def outbox_rows(rt, type_: str, causation: uuid.UUID) -> int:
    async with rt.pool.acquire() as conn:
        return await conn.fetchval("SELECT count(*) FROM outbox WHERE type=$1 AND convert_from(body, 'UTF8')::jsonb "
                                   "->> 'causation_id' = $2", type_, str(causation))


@pytest.mark.parametrize("mode, error", [
    ("nul", "CharacterNotInRepertoireError"), ("too_long", "StringDataRightTruncationError"),
    ("out_of_range", "NumericValueOutOfRangeError"), ("bad_text", "InvalidTextRepresentationError"),
    ("nul_json", "UntranslatableCharacterError"), ("unknown_ref", "ForeignKeyViolationError"),
    ("invalid", "invalid data (Strict): count"), ("permanent", "can never be stored"),
])
async def test_an_error_no_retry_can_fix_is_refused_once_through_the_callback_without_the_handlers_effects(
        kitprobe, nc, watch, mode, error):
    events = await watch("kitprobe.evt.>")
    n = number()
    cmd, seq = await send_command(nc.jetstream(), "kitprobe.store", {"n": n, "mode": mode})
    [hit] = await events.wait_for(caused_by(cmd))
    assert hit[1]["type"] == "kitprobe.refused" and hit[1]["data"]["n"] == n, hit
    assert error in hit[1]["data"]["reason"] and "\x00" not in hit[1]["data"]["reason"]
    await wait_acked(nc.jetstream(), STREAM, "kitprobe__kitprobe_store", seq)
    assert kitprobe.attempts[n] == 1                           # handled once: never retried
    assert await outbox_rows(kitprobe, "kitprobe.stored", cmd.id) == 0   # the handler's work rolled back
    async with kitprobe.pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM kit_items WHERE label = 'written before the failure'") == 0
        assert await conn.fetchval("SELECT count(*) FROM inbox WHERE consumer='kitprobe__kitprobe_store' AND "
                                   "event_id=$1", cmd.id) == 1


async def test_a_redelivered_refused_command_has_no_second_effect(kitprobe, nc, watch):
    js = nc.jetstream()
    events = await watch("kitprobe.evt.>")
    n = number()
    cmd, _ = await send_command(js, "kitprobe.store", {"n": n, "text": "x", "mode": "nul"})
    await events.wait_for(caused_by(cmd))
    _, again = await send_command(js, "kitprobe.store", {}, env=cmd, msg_id=f"redelivery-{cmd.id}")
    await wait_acked(js, STREAM, "kitprobe__kitprobe_store", again)
    assert kitprobe.attempts[n] == 1
    assert await outbox_rows(kitprobe, "kitprobe.refused", cmd.id) == 1   # the one refusal, nothing more
    assert len([i for i in events.items if i[1].get("causation_id") == str(cmd.id)]) == 1


async def test_without_a_callback_an_error_no_retry_can_fix_is_dead_lettered_at_once(kitprobe, nc, watch):
    dlq = await watch("deadletter.kitprobe.>")
    n = number()
    cmd, _ = await send_command(nc.jetstream(), "kitprobe.store_quietly", {"n": n, "mode": "nul"})
    [dead] = await dlq.wait_for(lambda i: i[1]["id"] == str(cmd.id))
    headers = dead[2]
    assert headers["Tessera-DLQ-Reason"] == "rejected" and headers["Tessera-DLQ-Deliveries"] == "1"
    assert "CharacterNotInRepertoireError" in headers["Tessera-DLQ-Error"]
    assert kitprobe.attempts[n] == 1
    assert await outbox_rows(kitprobe, "kitprobe.stored", cmd.id) == 0


async def test_a_transient_error_is_still_retried_and_then_handled(kitprobe, nc, watch):
    events = await watch("kitprobe.evt.>")
    n = number()
    cmd, _ = await send_command(nc.jetstream(), "kitprobe.store", {"n": n, "mode": "flaky"})
    [hit] = await events.wait_for(caused_by(cmd))
    assert hit[1]["type"] == "kitprobe.stored" and kitprobe.attempts[n] == 2


async def test_a_refusal_that_fails_for_a_transient_reason_is_retried_and_published_once(kitprobe, nc, watch):
    events = await watch("kitprobe.evt.>")
    n = number()
    cmd, seq = await send_command(nc.jetstream(), "kitprobe.store", {"n": n, "text": "refusal-flaky", "mode": "nul"})
    [hit] = await events.wait_for(caused_by(cmd))
    assert hit[1]["type"] == "kitprobe.refused"
    await wait_acked(nc.jetstream(), STREAM, "kitprobe__kitprobe_store", seq)
    assert (kitprobe.attempts[n], kitprobe.refusals[n]) == (2, 2)
    assert await outbox_rows(kitprobe, "kitprobe.refused", cmd.id) == 1


def step_cmd(label: str) -> dict:
    saga = uuid.uuid4()
    return {"saga_id": saga, "step": "do_step", "idempotency_key": step_key(saga, "do_step"),
            "allocation_id": uuid.uuid4(), "tenant_id": uuid.uuid4(), "label": label}


async def test_a_data_error_inside_a_steps_action_replies_the_steps_failure_once(kitprobe, nc, watch):
    js = nc.jetstream()
    replies = await watch("kitprobe.evt.>")
    label = f"n\x00{uuid.uuid4().hex[:6]}"
    cmd, _ = await send_command(js, "kitprobe.do_step", step_cmd(label))
    [hit] = await replies.wait_for(caused_by(cmd))
    assert hit[1]["type"] == "kitprobe.step_failed" and "CharacterNotInRepertoireError" in hit[1]["data"]["reason"]
    assert kitprobe.attempts[label] == 1                  # not retried: the saga hears at once
    again, seq = await send_command(js, "kitprobe.do_step", {**cmd.data})   # the saga asks again: same answer
    [repeat] = await replies.wait_for(caused_by(again))
    assert repeat[1]["type"] == "kitprobe.step_failed" and repeat[1]["data"]["reason"] == hit[1]["data"]["reason"]
    await wait_acked(js, STREAM, "kitprobe__kitprobe_do_step", seq)
    assert kitprobe.attempts[label] == 1
    async with kitprobe.pool.acquire() as conn:
        assert await conn.fetchval("SELECT status FROM step_outcomes WHERE idempotency_key=$1",
                                   cmd.data["idempotency_key"]) == "failed"


async def test_a_transient_error_inside_a_steps_action_is_retried_not_answered(kitprobe, nc, watch):
    replies = await watch("kitprobe.evt.>")
    cmd, _ = await send_command(nc.jetstream(), "kitprobe.do_step", step_cmd("flaky"))
    [hit] = await replies.wait_for(caused_by(cmd))
    assert hit[1]["type"] == "kitprobe.step_done" and kitprobe.attempts["flaky"] == 2


@pytest.mark.parametrize("label, reply, runs, stored", [
    ("done", "kitprobe.done_quickly", 1, 1),            # the usual case: one run, no savepoint
    ("refuse", "kitprobe.refused_quickly", 2, 0),       # refused: run again under savepoints, nothing stays
])
async def test_an_optimistic_step_alone_in_its_batch_is_answered_once_and_a_refusal_leaves_nothing(
        kitprobe, nc, watch, label, reply, runs, stored):
    js = nc.jetstream()
    replies = await watch("kitprobe.evt.>")
    label = f"{label}-{uuid.uuid4().hex[:6]}"
    cmd, seq = await send_command(js, "kitprobe.do_quickly", step_cmd(label))
    [hit] = await replies.wait_for(caused_by(cmd))
    assert hit[1]["type"] == reply
    await wait_acked(js, STREAM, "kitprobe__kitprobe_do_quickly", seq)
    info = await js.consumer_info(STREAM, "kitprobe__kitprobe_do_quickly")
    assert info.num_redelivered == 0                     # run again at once, not retried later
    assert kitprobe.attempts[label] == runs
    async with kitprobe.pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM kit_items WHERE label=$1", label) == stored
        assert await conn.fetchval("SELECT status FROM step_outcomes WHERE idempotency_key=$1",
                                   cmd.data["idempotency_key"]) == ("done" if stored else "failed")
