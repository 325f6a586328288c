"""The saga coordinator against real NATS JetStream and PostgreSQL.

Only the coordinator runs (in-process, its real bootstrap); the test plays every
participant: it watches the command subjects and publishes reply envelopes.
"""
from __future__ import annotations

import uuid
from functools import partial

from services.saga.bootstrap import build
from services.saga.domain.model import Policy
from services.saga.settings import SagaSettings
from shared.contract import load_catalog
from shared.envelope import utcnow
from tests.support.bus import make_envelope, publish_envelope
from tests.support.polling import eventually

COMMANDS = ["allocation.cmd.>", "scheduler.cmd.>", "network.cmd.>", "storage.cmd.>", "node_agent.cmd.>", "billing.cmd.>"]
# command type -> (success reply, failure reply); undo and release commands have one reply only
REPLIES = {
    "scheduler.reserve_slots": ("scheduler.slots_reserved", "scheduler.slot_reservation_failed"),
    "network.attach_network": ("network.network_attached", "network.network_attach_failed"),
    "storage.provision_volume": ("storage.volume_provisioned", "storage.volume_provision_failed"),
    "node_agent.provision": ("node_agent.node_provisioned", "node_agent.node_provision_failed"),
    "allocation.activate": ("allocation.activated", "allocation.activation_failed"),
    "scheduler.release_slots": ("scheduler.slots_released", None),
    "network.detach_network": ("network.network_detached", None),
    "storage.delete_volume": ("storage.volume_deleted", None),
    "node_agent.deprovision": ("node_agent.node_deprovisioned", None),
    "node_agent.wipe_slots": ("node_agent.slots_wiped", None),
    "billing.stop_meter": ("billing.meter_stopped", None),
    "allocation.mark_released": ("allocation.released", None),
}
# a step that gets no reply times out fast; undo replies have plenty of time
SHORT_STEP = SagaSettings(Policy(step_timeout_s=1.5, compensation_timeout_s=15, backoff_s=(0.1,)), deadline_poll_s=0.05)
# an undo that gets no reply is resent fast, and given up after two attempts
SHORT_UNDO = SagaSettings(Policy(compensation_timeout_s=0.5, compensation_attempts=2, backoff_s=(0.1,)), deadline_poll_s=0.05)


class Participants:
    """Plays scheduler, network, storage, node-agent, billing and allocation for one allocation."""

    def __init__(self, js, watchers, events, allocation_id: uuid.UUID, tenant_id: uuid.UUID):
        self.js, self.watchers, self.events = js, watchers, events
        self.allocation_id, self.tenant_id = allocation_id, tenant_id
        self.node_id = uuid.uuid4()

    @classmethod
    async def start(cls, watch, nc) -> Participants:
        """Watch from now on (start before the saga does anything)."""
        watchers = [await watch(s) for s in COMMANDS]
        return cls(nc.jetstream(), watchers, await watch("saga.evt.>"), uuid.uuid4(), uuid.uuid4())

    def another(self) -> Participants:
        """The same watchers, for another allocation."""
        return Participants(self.js, self.watchers, self.events, uuid.uuid4(), uuid.uuid4())

    def _mine(self, item, type_: str) -> bool:
        env = item[1]
        return env["type"] == type_ and env["data"].get("allocation_id") == str(self.allocation_id)

    def _watcher(self, type_: str):
        return self.watchers[COMMANDS.index(type_.split(".")[0] + ".cmd.>")]

    async def command(self, type_: str, nth: int = 1, timeout: float = 20) -> dict:
        """The nth command of ``type_`` for this allocation (envelope dict), waiting for it."""
        await self._watcher(type_).wait_for(lambda _item: len(self.commands(type_)) >= nth, timeout)
        return self.commands(type_)[nth - 1]

    def commands(self, type_: str) -> list[dict]:
        """Every command of ``type_`` seen so far for this allocation."""
        return [x[1] for x in self._watcher(type_).items if self._mine(x, type_)]

    async def event(self, type_: str, pred=lambda d: True, timeout: float = 20) -> dict:
        hits = await self.events.wait_for(lambda i: self._mine(i, type_) and pred(i[1]["data"]), timeout)
        return hits[0][1]["data"]

    def step_changes(self) -> list[tuple[str, str, str]]:
        return [(d["step"], d.get("phase", "invoke"), d["status"]) for _, e, _ in self.events.items
                if self._mine((None, e), "saga.step_changed") for d in [e["data"]]]

    async def request(self, **overrides):
        data = {"allocation_id": self.allocation_id, "tenant_id": self.tenant_id, "state": "REQUESTED", "at": utcnow(),
                "user_id": uuid.uuid4(), "name": "trainer", "shape": "vm.2gpu", "gpu_count": 2, "volume_gb": 20,
                "labels": {"team": "ml"}, **overrides}
        return await self.publish("allocation.requested", data)

    async def request_release(self, node_id: uuid.UUID | None) -> None:
        await self.publish("allocation.release_requested", {
            "allocation_id": self.allocation_id, "tenant_id": self.tenant_id, "state": "RELEASING", "at": utcnow(),
            "requested_by": uuid.uuid4(), "node_id": node_id, "volume_gb": 20, "labels": {"team": "ml"}})

    async def succeed(self, cmd: dict, **fields) -> None:
        type_ = REPLIES[cmd["type"]][0]
        await self.publish(type_, {**self._base(cmd), **self._ok_fields(type_), **fields})

    async def fail(self, cmd: dict, reason: str) -> None:
        await self.publish(REPLIES[cmd["type"]][1], {**self._base(cmd), "reason": reason})

    async def publish(self, type_: str, data: dict):
        subject = load_catalog().message(type_).render_subject(node_id=str(self.node_id))
        env = make_envelope(type_, data, tenant_id=self.tenant_id, correlation_id=str(self.allocation_id))
        await publish_envelope(self.js, subject, env)
        return env

    @staticmethod
    def _base(cmd: dict) -> dict:
        return {k: cmd["data"][k] for k in ("saga_id", "step", "idempotency_key", "allocation_id")}

    def _ok_fields(self, type_: str) -> dict:
        attachment_id, network_id = uuid.uuid4(), uuid.uuid4()
        attachment = {"attachment_id": attachment_id, "allocation_id": self.allocation_id, "network_id": network_id,
                      "ip_address": "10.9.0.7", "prefix_len": 24, "mac_address": "02:00:0a:09:00:07"}
        return {
            "scheduler.slots_reserved": {"node_id": self.node_id, "slots": [0, 1], "gpu_model": "H100"},
            "network.network_attached": {"attachment_id": attachment_id, "vni": 4242, "ip_address": "10.9.0.7",
                                         "mac_address": "02:00:0a:09:00:07", "attachment": attachment,
                                         "tenant_networks": {"tenant_id": self.tenant_id, "version": 1, "networks": []}},
            "storage.volume_provisioned": {"volume_id": uuid.uuid4(), "size_gb": 20},
            "node_agent.node_provisioned": {"node_id": self.node_id, "instance_id": "vm-7"},
            "node_agent.slots_wiped": {"node_id": self.node_id},
            "node_agent.node_deprovisioned": {"node_id": self.node_id},
            "allocation.activated": {"tenant_id": self.tenant_id, "state": "ACTIVE", "at": utcnow(), "node_id": self.node_id},
            "allocation.released": {"tenant_id": self.tenant_id, "state": "RELEASED", "at": utcnow()},
        }.get(type_, {})


async def saga_row(rt, allocation_id: uuid.UUID, kind: str = "allocate"):
    async with rt.pool.acquire() as conn:
        return await conn.fetchrow("SELECT * FROM sagas WHERE allocation_id=$1 AND kind=$2", allocation_id, kind)


ALLOCATE_ORDER = ["scheduler.reserve_slots", "network.attach_network", "storage.provision_volume",
                  "node_agent.provision", "allocation.activate"]


async def test_happy_path_sends_every_step_command_in_order_and_finally_activates(run_service, watch, nc):
    rt = await run_service("saga", build)
    p = await Participants.start(watch, nc)
    await p.request()
    saga_id = (await p.event("saga.started"))["saga_id"]
    for type_ in ALLOCATE_ORDER:
        cmd = await p.command(type_)
        assert cmd["data"]["labels"] == {"team": "ml"} and cmd["data"]["saga_id"] == saga_id
        await p.succeed(cmd)
    await p.event("saga.completed")
    provision = p.commands("node_agent.provision")[0]
    assert provision["data"]["node_id"] == str(p.node_id) and provision["data"]["ip_address"] == "10.9.0.7"
    assert p.commands("allocation.activate")[0]["data"]["node_id"] == str(p.node_id)
    # each step invoked once (in order: the loop above answered each before the next came); the command says
    # so, and no saga.step_changed restates it
    steps = [(c["data"]["step"], c["type"]) for t in ALLOCATE_ORDER for c in p.commands(t)]
    assert steps == list(zip(["reserve_slots", "attach_network", "provision_volume", "provision_node", "activate"],
                             ALLOCATE_ORDER))
    assert p.step_changes() == []
    assert (await saga_row(rt, p.allocation_id))["status"] == "completed"


async def test_failed_attach_network_releases_reserved_slots_then_fails_the_allocation(run_service, watch, nc):
    await run_service("saga", build)
    p = await Participants.start(watch, nc)
    await p.request()
    await p.succeed(await p.command("scheduler.reserve_slots"))
    await p.fail(await p.command("network.attach_network"), "no VNI left in the tenant's range")
    release = await p.command("scheduler.release_slots")
    saga_id = release["data"]["saga_id"]
    assert release["data"]["compensates"] == f"{saga_id}:reserve_slots"
    assert release["data"]["idempotency_key"] == f"{saga_id}:compensate:reserve_slots"
    assert not p.commands("allocation.fail")          # not before the undo is confirmed
    await p.succeed(release)
    fail = await p.command("allocation.fail")
    assert fail["data"]["failed_step"] == "attach_network"
    assert fail["data"]["reason"] == "no VNI left in the tenant's range"
    failed = await p.event("saga.failed")
    assert failed["compensated"] == ["reserve_slots"]
    assert not p.commands("storage.provision_volume") and not p.commands("network.detach_network")
    assert p.step_changes() == []       # the refusal, the undo and its confirmation say every step change


async def test_unanswered_step_times_out_and_is_compensated_with_the_steps_before_it(run_service, watch, nc):
    rt = await run_service("saga", partial(build, saga=SHORT_STEP))
    p = await Participants.start(watch, nc)
    await p.request()
    await p.succeed(await p.command("scheduler.reserve_slots"))
    attach = await p.command("network.attach_network")          # never answered
    detach = await p.command("network.detach_network", timeout=10)
    assert detach["data"]["compensates"] == attach["data"]["idempotency_key"]
    assert not p.commands("scheduler.release_slots")              # reverse order: one undo at a time
    await p.succeed(attach)                                       # a late success changes nothing
    await p.succeed(detach)
    await p.succeed(await p.command("scheduler.release_slots"))
    fail = await p.command("allocation.fail")
    assert (fail["data"]["failed_step"], fail["data"]["reason"]) == ("attach_network", "timed out after 1.5s")
    assert (await p.event("saga.failed"))["compensated"] == ["attach_network", "reserve_slots"]
    row = await saga_row(rt, p.allocation_id)
    assert (row["status"], row["failed_step"]) == ("failed", "attach_network")
    assert not p.commands("storage.provision_volume")
    assert p.step_changes() == [("attach_network", "invoke", "timed_out")]   # the one change no message states


async def test_unconfirmed_compensation_is_resent_then_reported_to_operators(run_service, watch, nc):
    await run_service("saga", partial(build, saga=SHORT_UNDO))
    p = await Participants.start(watch, nc)
    await p.request()
    await p.succeed(await p.command("scheduler.reserve_slots"))
    await p.fail(await p.command("network.attach_network"), "switch unreachable")
    first = await p.command("scheduler.release_slots")
    second = await p.command("scheduler.release_slots", nth=2, timeout=10)   # never answered either
    assert second["data"]["idempotency_key"] == first["data"]["idempotency_key"]
    report = await p.event("saga.compensation_failed", timeout=10)
    assert (report["step"], report["attempts"]) == ("reserve_slots", 2)
    fail = await p.command("allocation.fail")
    assert (fail["data"]["failed_step"], fail["data"]["reason"]) == ("attach_network", "switch unreachable")
    await p.event("saga.step_changed", lambda d: d["status"] == "failed")
    assert p.step_changes() == [("reserve_slots", "compensate", "retrying"), ("reserve_slots", "compensate", "failed")]


async def test_saga_stopped_mid_way_finishes_on_a_new_runtime_over_the_same_database(run_service, watch, nc):
    first = await run_service("saga", build)
    p = await Participants.start(watch, nc)
    await p.request()
    await p.succeed(await p.command("scheduler.reserve_slots"))
    attach = await p.command("network.attach_network")
    await first.stop()
    await p.succeed(attach)               # answered while no coordinator runs: waits in the stream
    second = await run_service("saga", build)
    for type_ in ALLOCATE_ORDER[2:]:
        await p.succeed(await p.command(type_))
    await p.event("saga.completed")
    assert len(p.commands("network.attach_network")) == 1 and len(p.commands("scheduler.reserve_slots")) == 1
    assert (await saga_row(second, p.allocation_id))["status"] == "completed"


async def test_release_saga_runs_every_release_step_then_marks_the_allocation_released(run_service, watch, nc):
    rt = await run_service("saga", build)
    p = await Participants.start(watch, nc)
    await p.request_release(p.node_id)
    for type_ in ["billing.stop_meter", "node_agent.deprovision", "node_agent.wipe_slots", "storage.delete_volume",
                  "network.detach_network", "scheduler.release_slots", "allocation.mark_released"]:
        cmd = await p.command(type_)
        assert cmd["data"].get("compensates") is None
        await p.succeed(cmd)
    assert p.commands("node_agent.deprovision")[0]["data"]["node_id"] == str(p.node_id)
    assert p.commands("node_agent.wipe_slots")[0]["data"]["node_id"] == str(p.node_id)
    await p.event("saga.completed")
    assert (await saga_row(rt, p.allocation_id, "release"))["status"] == "completed"
    assert not p.commands("scheduler.reserve_slots")


async def test_a_second_allocation_requested_for_one_allocation_starts_no_second_saga(run_service, watch, nc):
    rt = await run_service("saga", build)
    p = await Participants.start(watch, nc)
    events = [await p.request(), await p.request()]     # two events (two ids) for the same allocation

    async def both_handled():
        async with rt.pool.acquire() as conn:
            return await conn.fetchval("SELECT count(*) FROM inbox WHERE event_id = ANY($1::uuid[])",
                                       [e.id for e in events]) == 2
    await eventually(both_handled, timeout=20)
    async with rt.pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM sagas WHERE allocation_id=$1", p.allocation_id) == 1
        marks = await conn.fetchval("SELECT count(*) FROM outbox WHERE type='scheduler.reserve_slots' "
                                    "AND convert_from(body, 'UTF8')::jsonb->'data'->>'allocation_id' = $1",
                                    str(p.allocation_id))
    assert marks == 1


async def test_two_coordinators_handle_each_passed_deadline_once(run_service, watch, nc):
    await run_service("saga", partial(build, saga=SHORT_STEP), instance="a")
    await run_service("saga", partial(build, saga=SHORT_STEP), instance="b")
    first = await Participants.start(watch, nc)
    ps = [first] + [first.another() for _ in range(3)]
    for p in ps:
        await p.request()
    for p in ps:
        await p.succeed(await p.command("scheduler.reserve_slots"))
    for p in ps:
        await p.command("network.attach_network")                 # left to time out
        await p.succeed(await p.command("network.detach_network", timeout=10))
    for p in ps:
        await p.succeed(await p.command("scheduler.release_slots"))
        await p.command("allocation.fail")
        await p.event("saga.failed")
    for p in ps:
        assert p.step_changes().count(("attach_network", "invoke", "timed_out")) == 1
        assert len(p.commands("network.detach_network")) == 1
        assert len(p.commands("allocation.fail")) == 1
