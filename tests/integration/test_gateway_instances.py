"""An ACTIVE allocation's instance through the gateway: what runs (allocation.activated's instance), power actions
(recorded, sent to the node, finished by node_agent.power_changed) and the serial console (read live from the
node-agent over request/reply). The tests play the node-agent: they watch its power commands, answer its console
requests (shared.rpc.serve) and publish its events."""
from __future__ import annotations

import asyncio
import json
import uuid
from datetime import datetime, timedelta

import pytest

from services.node_agent.contracts import ConsoleChunk, ReadConsole
from shared.contract import load_catalog
from shared.envelope import utcnow
from shared.rpc import serve
from tests.support.bus import make_envelope, publish_envelope
from tests.support.gateway import PROJECTED_WITHIN_S, SseReader, assert_problem, publish
from tests.support.polling import eventually

AT = "2030-01-01T00:00:00Z"


def instance(node_id: uuid.UUID, **over) -> dict:
    doc = {"instance_id": f"tessera-{uuid.uuid4().hex[:8]}", "driver": "libvirt", "dataplane": "kernel",
           "node_id": str(node_id), "image": "ubuntu-24.04", "hostname": "train-1", "passthrough": "simulated",
           "booted_at": AT, "boot_s": 11.5, "power_state": "running"}
    doc.update(over)
    return doc


async def publish_from_node(nc, type_: str, node_id: uuid.UUID, data: dict, tenant_id: str | None = None):
    """Play the node-agent: publish its event on its node's subject; returns the envelope."""
    subject = load_catalog().message(type_).render_subject(node_id=str(node_id))
    env = make_envelope(type_, data, tenant_id=uuid.UUID(tenant_id) if tenant_id else None,
                        correlation_id=str(data.get("allocation_id") or node_id))
    await publish_envelope(nc.jetstream(), subject, env)
    return env


def answering(command: dict) -> dict:
    """What node_agent.power_changed repeats of the node_agent.power it answers (all but the deadline)."""
    return {k: v for k, v in command.items() if k != "expires_at"}


async def active(api, nc, client, tenant_id: str, node_id: uuid.UUID, with_instance: bool = True) -> dict:
    """An allocation of the tenant, ACTIVE on ``node_id`` as allocation.activated says (with its instance)."""
    a = (await client.post("/v1/allocations", {"name": "train-1", "shape": "vm.1gpu"})).body
    saga = uuid.uuid4()
    data = {"allocation_id": a["id"], "tenant_id": tenant_id, "state": "ACTIVE", "at": AT, "saga_id": saga,
            "step": "activate", "idempotency_key": f"{saga}:activate", "node_id": node_id,
            "instance": instance(node_id) if with_instance else None}
    await publish(nc, "allocation.activated", data, tenant_id)

    async def shown():
        body = (await client.get(f"/v1/allocations/{a['id']}")).body
        return body if body["state"] == "ACTIVE" else None
    return await eventually(shown, timeout=PROJECTED_WITHIN_S, what="the allocation to be ACTIVE")


async def leave_active(api, nc, a: dict) -> None:
    await publish(nc, "allocation.release_requested", {"allocation_id": a["id"], "tenant_id": a["tenant_id"],
                  "state": "RELEASING", "at": AT, "requested_by": uuid.uuid4()}, a["tenant_id"])


class FakeConsole:
    """The node-agent's console of one allocation: a growing log, answered in byte ranges."""

    def __init__(self, allocation_id: str, tenant_id: str, text: str = ""):
        self.allocation_id, self.tenant_id, self.log = uuid.UUID(allocation_id), uuid.UUID(tenant_id), text.encode()
        self.reads: list[ReadConsole] = []

    async def answer(self, req: ReadConsole) -> ConsoleChunk:
        self.reads.append(req)
        if (req.allocation_id, req.tenant_id) != (self.allocation_id, self.tenant_id):
            return ConsoleChunk(found=False, offset=0, next_offset=0)
        start = max(len(self.log) - req.limit, 0) if req.offset < 0 else min(req.offset, len(self.log))
        part = self.log[start:start + req.limit]
        return ConsoleChunk(found=True, offset=start, next_offset=start + len(part), text=part.decode(), running=True)


@pytest.fixture
async def node_console(nc):
    """node_console(node_id, console) answers node_agent.read_console on that node until the test ends."""
    subs = []

    async def _serve(node_id: uuid.UUID, console: FakeConsole):
        subs.append(await serve(nc, load_catalog(), "node_agent", "node_agent.read_console", console.answer,
                                node_id=str(node_id)))
    yield _serve
    for sub in subs:
        await sub.unsubscribe()


# --- what runs -------------------------------------------------------------------------------------------------

async def test_an_active_allocation_shows_its_instance_and_says_when_passthrough_is_simulated(api, nc):
    client, tenant_id = await api.tenant_user()
    node = uuid.uuid4()
    a = await active(api, nc, client, tenant_id, node)
    assert a["node_id"] == str(node)
    assert a["instance"]["passthrough"] == "simulated" and a["instance"]["power_state"] == "running"
    assert a["instance"]["driver"] == "libvirt" and a["instance"]["boot_s"] == 11.5
    listed = {i["id"]: i for i in (await client.get("/v1/allocations")).body["items"]}
    assert listed[a["id"]]["instance"] == a["instance"]


# --- power actions -----------------------------------------------------------------------------------------------

async def test_a_power_action_is_recorded_sent_to_the_node_and_finished_by_its_answer(api, nc, watch):
    tenant_id = await api.new_tenant()
    client, user = await api.new_user(tenant_id)
    node = uuid.uuid4()
    a = await active(api, nc, client, tenant_id, node)
    commands = await watch(f"node_agent.cmd.power.{node}")
    r = await client.post(f"/v1/allocations/{a['id']}/actions/stop")
    assert r.status == 202 and r.body["state"] == "pending" and r.body["action"] == "stop"
    assert r.body["requested_by"] == user["id"] and r.headers["Location"] == r.body["links"]["self"]
    [(_, env, _)] = await commands.wait_for(lambda i: i[1]["data"]["request_id"] == r.body["id"])
    assert env["type"] == "node_agent.power" and env["tenant_id"] == tenant_id and env["correlation_id"] == a["id"]
    sent = dict(env["data"])
    expires_at = datetime.fromisoformat(sent.pop("expires_at"))
    assert sent == {"request_id": r.body["id"], "allocation_id": a["id"], "tenant_id": tenant_id,
                    "node_id": str(node), "action": "stop", "requested_by": user["id"]}
    # the deadline: the request's time plus TESSERA_POWER_ACTION_TTL_S (300 s by default), shown on the action
    assert expires_at == datetime.fromisoformat(r.body["expires_at"])
    requested = datetime.fromisoformat(r.body["requested_at"])
    assert timedelta(seconds=299) < expires_at - requested < timedelta(seconds=301)
    done = await publish_from_node(nc, "node_agent.power_changed", node, {
        **answering(env["data"]), "ok": True, "power_state": "stopped", "at": utcnow()}, tenant_id)

    async def finished():
        return (await client.get(r.headers["Location"])).body
    action = await eventually(finished, timeout=PROJECTED_WITHIN_S, until=lambda b: b["state"] != "pending")
    assert action["state"] == "succeeded" and action["power_state"] == "stopped" and action["finished_at"]
    assert (await client.get(f"/v1/allocations/{a['id']}")).body["instance"]["power_state"] == "stopped"
    # the outcome is an event of the allocation's stream
    async with client.http.get(a["links"]["events"], headers={"Authorization": f"Bearer {client.token}"}) as resp:
        sse = SseReader(resp)
        while (event := await sse.next_event())["id"] != str(done.id):
            pass
        assert event["event"] == "node_agent.power_changed" and json.loads(event["data"])["data"]["ok"] is True


async def test_a_failed_action_keeps_its_reason_and_an_older_outcome_does_not_move_the_power_state(api, nc, watch):
    client, tenant_id = await api.tenant_user()
    node = uuid.uuid4()
    a = await active(api, nc, client, tenant_id, node)
    commands = await watch(f"node_agent.cmd.power.{node}")
    stop = (await client.post(f"/v1/allocations/{a['id']}/actions/stop")).body
    reboot = (await client.post(f"/v1/allocations/{a['id']}/actions/reboot")).body
    await eventually(lambda: len(commands.items), timeout=PROJECTED_WITHIN_S, until=lambda n: n == 2)
    sent = {i[1]["data"]["action"]: i[1]["data"] for i in commands.items}
    newer = await publish_from_node(nc, "node_agent.power_changed", node, {
        **answering(sent["reboot"]), "ok": False, "power_state": "unknown", "reason": "the domain did not come back",
        "at": utcnow()}, tenant_id)
    await eventually(lambda: api.handled(newer), timeout=PROJECTED_WITHIN_S)
    older = await publish_from_node(nc, "node_agent.power_changed", node, {
        **answering(sent["stop"]), "ok": True, "power_state": "stopped", "at": "2020-01-01T00:00:00Z"}, tenant_id)
    await eventually(lambda: api.handled(older), timeout=PROJECTED_WITHIN_S)
    page = (await client.get(f"/v1/allocations/{a['id']}/actions")).body
    assert [i["id"] for i in page["items"]] == [reboot["id"], stop["id"]] and page["next_cursor"] is None
    assert page["items"][0]["state"] == "failed" and page["items"][0]["reason"] == "the domain did not come back"
    assert page["items"][1]["state"] == "succeeded" and page["items"][1]["power_state"] == "stopped"
    one = (await client.get(f"/v1/allocations/{a['id']}/actions?limit=1")).body
    assert [i["id"] for i in one["items"]] == [reboot["id"]] and one["next_cursor"]
    assert (await client.get(f"/v1/allocations/{a['id']}")).body["instance"]["power_state"] == "unknown"


async def test_an_action_no_node_answers_fails_after_its_deadline_and_a_late_answer_still_shows(gateway, nc, watch):
    api = await gateway(power_action_ttl_s=1, power_action_grace_s=0.2, power_sweep_s=0.2)
    client, tenant_id = await api.tenant_user()
    node = uuid.uuid4()
    a = await active(api, nc, client, tenant_id, node)
    commands = await watch(f"node_agent.cmd.power.{node}")
    expired_events = await watch("gateway.evt.power_action_expired")
    silent = (await client.post(f"/v1/allocations/{a['id']}/actions/stop")).body
    assert silent["state"] == "pending" and silent["expires_at"]
    [(_, cmd, _)] = await commands.wait_for(lambda i: i[1]["data"]["request_id"] == silent["id"])
    assert datetime.fromisoformat(cmd["data"]["expires_at"]) == datetime.fromisoformat(silent["expires_at"])
    # nobody answers the stop: once its deadline and the grace have passed, the gateway fails it
    action = await eventually(lambda: client.get(silent["links"]["self"]), timeout=PROJECTED_WITHIN_S,
                              until=lambda r: r.body["state"] != "pending", what="the unanswered action to end")
    failed = action.body
    assert failed["state"] == "failed" and failed["power_state"] is None
    assert datetime.fromisoformat(failed["finished_at"]) > datetime.fromisoformat(silent["expires_at"])
    assert str(node) in failed["reason"] and datetime.fromisoformat(silent["expires_at"]).isoformat() in failed["reason"]
    [(_, expired, _)] = await expired_events.wait_for(lambda i: i[1]["data"]["request_id"] == silent["id"])
    assert expired["data"]["node_id"] == str(node) and expired["data"]["reason"] == failed["reason"]
    assert await api.scalar("SELECT type FROM allocation_events WHERE event_id=$1 AND allocation_id=$2",
                            uuid.UUID(expired["id"]), uuid.UUID(a["id"])) == "gateway.power_action_expired"
    # the node did stop the VM after all (it had it in time; the answer was slow): the outcome wins, saying so
    late = await publish_from_node(nc, "node_agent.power_changed", node, {
        **answering(cmd["data"]), "ok": True, "power_state": "stopped", "at": utcnow()}, tenant_id)
    await eventually(lambda: api.handled(late), timeout=PROJECTED_WITHIN_S)
    shown = (await client.get(silent["links"]["self"])).body
    assert shown["state"] == "succeeded" and shown["power_state"] == "stopped"
    assert shown["reason"].startswith("the node carried it out, answering after the gateway had given up on it")
    assert failed["reason"] in shown["reason"]
    assert (await client.get(f"/v1/allocations/{a['id']}")).body["instance"]["power_state"] == "stopped"
    # a second answer to it changes nothing
    again = await publish_from_node(nc, "node_agent.power_changed", node, {
        **answering(cmd["data"]), "ok": False, "power_state": "unknown", "reason": "twice", "at": utcnow()}, tenant_id)
    await eventually(lambda: api.handled(again), timeout=PROJECTED_WITHIN_S)
    assert (await client.get(silent["links"]["self"])).body == shown


async def test_a_late_refusal_keeps_the_action_failed_with_both_reasons(gateway, nc, watch):
    api = await gateway(power_action_ttl_s=1, power_action_grace_s=0.2, power_sweep_s=0.2)
    client, tenant_id = await api.tenant_user()
    node = uuid.uuid4()
    a = await active(api, nc, client, tenant_id, node)
    commands = await watch(f"node_agent.cmd.power.{node}")
    reboot = (await client.post(f"/v1/allocations/{a['id']}/actions/reboot")).body
    [(_, cmd, _)] = await commands.wait_for(lambda i: i[1]["data"]["request_id"] == reboot["id"])
    expired = await eventually(lambda: client.get(reboot["links"]["self"]), timeout=PROJECTED_WITHIN_S,
                               until=lambda r: r.body["state"] == "failed")
    refusal = "expired: the node received it at 2030-01-01T00:00:00+00:00, after its deadline ..."
    late = await publish_from_node(nc, "node_agent.power_changed", node, {
        **answering(cmd["data"]), "ok": False, "power_state": "running", "reason": refusal, "at": utcnow()}, tenant_id)
    await eventually(lambda: api.handled(late), timeout=PROJECTED_WITHIN_S)
    shown = (await client.get(reboot["links"]["self"])).body
    assert shown["state"] == "failed" and shown["power_state"] == "running"
    assert shown["reason"] == (f"the node answered after the gateway had given up on it: {refusal} "
                               f"({expired.body['reason']})")


async def test_a_power_action_needs_an_active_allocation_and_a_known_action(api, nc):
    client, tenant_id = await api.tenant_user()
    fresh = (await client.post("/v1/allocations", {"name": "fresh", "shape": "vm.1gpu"})).body
    problem = assert_problem(await client.post(f"/v1/allocations/{fresh['id']}/actions/reboot"), 409)
    assert "REQUESTED" in problem["detail"]
    a = await active(api, nc, client, tenant_id, uuid.uuid4())
    assert_problem(await client.post(f"/v1/allocations/{a['id']}/actions/hibernate"), 422, "action")
    await leave_active(api, nc, a)
    await eventually(lambda: client.get(f"/v1/allocations/{a['id']}"), timeout=PROJECTED_WITHIN_S,
                     until=lambda r: r.body["state"] == "RELEASING")
    assert "RELEASING" in assert_problem(await client.post(f"/v1/allocations/{a['id']}/actions/start"), 409)["detail"]
    assert await api.scalar("SELECT count(*) FROM instance_actions WHERE tenant_id=$1", uuid.UUID(tenant_id)) == 0
    admin = await api.admin()
    assert_problem(await admin.post(f"/v1/allocations/{a['id']}/actions/reboot"), 403)


async def test_an_instance_problem_the_node_found_is_in_the_allocations_stream(api, nc):
    client, tenant_id = await api.tenant_user()
    node = uuid.uuid4()
    a = await active(api, nc, client, tenant_id, node)
    env = await publish_from_node(nc, "node_agent.instance_problem", node, {
        "node_id": node, "allocation_id": a["id"], "instance_id": a["instance"]["instance_id"],
        "problem": "instance_restarted", "detail": "the domain was shut off; started again"})
    await eventually(lambda: api.handled(env), timeout=PROJECTED_WITHIN_S)
    assert await api.scalar("SELECT type FROM allocation_events WHERE event_id=$1 AND allocation_id=$2", env.id,
                            uuid.UUID(a["id"])) == "node_agent.instance_problem"


# --- the console -------------------------------------------------------------------------------------------------

async def test_the_console_tail_is_read_from_the_node_as_text(api, nc, node_console):
    tenant_id = await api.new_tenant()
    client, user = await api.new_user(tenant_id)
    node = uuid.uuid4()
    a = await active(api, nc, client, tenant_id, node)
    console = FakeConsole(a["id"], tenant_id, "".join(f"boot line {n}\n" for n in range(1000)))
    await node_console(node, console)
    r = await client.get(f"/v1/allocations/{a['id']}/console")
    assert r.status == 200 and r.content_type == "text/plain" and r.body.endswith("boot line 999\n")
    assert len(r.body.encode()) == 65536 or r.body.startswith("boot line 0\n")
    r = await client.get(f"/v1/allocations/{a['id']}/console?tail=14")
    assert r.body == "boot line 999\n"
    assert [(q.offset, q.limit) for q in console.reads] == [(-1, 65536), (-1, 14)]
    for bad in ("tail=0", f"tail={(1 << 20) + 1}", "tail=x", "follow=yes"):
        assert_problem(await client.get(f"/v1/allocations/{a['id']}/console?{bad}"), 422, bad.split("=")[0])


async def test_following_the_console_streams_what_it_prints_until_the_allocation_leaves_active(api, nc, node_console):
    client, tenant_id = await api.tenant_user()
    node = uuid.uuid4()
    a = await active(api, nc, client, tenant_id, node)
    console = FakeConsole(a["id"], tenant_id, "login: ")
    await node_console(node, console)
    url = f"/v1/allocations/{a['id']}/console?follow=true"
    async with client.http.get(url, headers={"Authorization": f"Bearer {client.token}"}) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain")
        seen = ""

        async def read_more() -> str:
            nonlocal seen
            seen += (await asyncio.wait_for(resp.content.readany(), PROJECTED_WITHIN_S)).decode()
            return seen
        await eventually(read_more, timeout=PROJECTED_WITHIN_S, until=lambda s: s == "login: ")
        console.log += b"root\nWelcome to Ubuntu\n"
        await eventually(read_more, timeout=PROJECTED_WITHIN_S, until=lambda s: s.endswith("Welcome to Ubuntu\n"))
        assert seen == "login: root\nWelcome to Ubuntu\n"
        await leave_active(api, nc, a)
        rest = await asyncio.wait_for(resp.content.read(), PROJECTED_WITHIN_S)   # the stream ends
        assert rest == b""
    assert all(q.offset >= 0 for q in console.reads[1:])


async def test_a_followed_console_stops_reading_the_node_once_the_client_leaves(api, nc, node_console):
    from services.gateway.http.state import GATEWAY
    streams = api.rt.http[GATEWAY].streams
    client, tenant_id = await api.tenant_user()
    node = uuid.uuid4()
    a = await active(api, nc, client, tenant_id, node)
    console = FakeConsole(a["id"], tenant_id, "ready\n")
    await node_console(node, console)
    resp = await client.http.get(f"/v1/allocations/{a['id']}/console?follow=true",
                                 headers={"Authorization": f"Bearer {client.token}"})
    assert await resp.content.readany() == b"ready\n"
    await eventually(lambda: len(streams), timeout=PROJECTED_WITHIN_S, until=lambda n: n == 1)
    resp.close()   # the client leaves without reading to the end
    await eventually(lambda: len(streams), timeout=PROJECTED_WITHIN_S, until=lambda n: n == 0,
                     what="the follow to end once its client left")


async def test_a_followed_console_ends_after_the_maximum_follow_time(gateway, nc, node_console):
    api = await gateway(console_follow_max_s=1, console_poll_s=0.1)
    client, tenant_id = await api.tenant_user()
    node = uuid.uuid4()
    a = await active(api, nc, client, tenant_id, node)
    await node_console(node, FakeConsole(a["id"], tenant_id, "ready\n"))
    async with client.http.get(f"/v1/allocations/{a['id']}/console?follow=true",
                               headers={"Authorization": f"Bearer {client.token}"}) as resp:
        assert await asyncio.wait_for(resp.content.read(), PROJECTED_WITHIN_S) == b"ready\n"


async def test_the_console_is_a_503_naming_the_node_when_no_agent_answers_and_404_when_it_has_none(api, nc,
                                                                                                     node_console):
    client, tenant_id = await api.tenant_user()
    node = uuid.uuid4()
    a = await active(api, nc, client, tenant_id, node)
    problem = assert_problem(await client.get(f"/v1/allocations/{a['id']}/console"), 503)
    assert str(node) in problem["detail"]
    await node_console(node, FakeConsole(str(uuid.uuid4()), tenant_id, "someone else's\n"))
    problem = assert_problem(await client.get(f"/v1/allocations/{a['id']}/console?follow=true"), 404)
    assert problem["type"].endswith("/no-console")
    fresh = (await client.post("/v1/allocations", {"name": "fresh", "shape": "vm.1gpu"})).body
    assert_problem(await client.get(f"/v1/allocations/{fresh['id']}/console"), 409)


# --- another tenant --------------------------------------------------------------------------------------------

async def test_another_tenants_allocation_is_a_404_on_every_instance_route(api, nc, watch, node_console):
    alice, tenant_id = await api.tenant_user()
    bob, _ = await api.tenant_user("tenant_admin")
    node = uuid.uuid4()
    a = await active(api, nc, alice, tenant_id, node)
    console = FakeConsole(a["id"], tenant_id, "secret\n")
    await node_console(node, console)
    action = (await alice.post(f"/v1/allocations/{a['id']}/actions/reboot")).body
    base = f"/v1/allocations/{a['id']}"
    for who, method, path in ((bob, "POST", f"{base}/actions/reboot"), (bob, "GET", f"{base}/actions"),
                              (bob, "GET", f"{base}/actions/{action['id']}"), (bob, "GET", f"{base}/console"),
                              (bob, "GET", f"{base}/console?follow=true"),
                              (bob, "POST", f"/v1/allocations/{uuid.uuid4()}/actions/stop"),
                              (bob, "GET", f"/v1/allocations/{uuid.uuid4()}/console"),
                              (alice, "GET", f"{base}/actions/{uuid.uuid4()}"),
                              (alice, "GET", f"{base}/actions/not-a-uuid"),
                              (alice, "GET", "/v1/allocations/not-a-uuid/console")):
        assert_problem(await who.call(method, path), 404)
    assert console.reads == []
    assert await api.scalar("SELECT count(*) FROM instance_actions WHERE allocation_id=$1", uuid.UUID(a["id"])) == 1
