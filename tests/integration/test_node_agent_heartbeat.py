"""The node-agent's health against real NATS and PostgreSQL, over the sim driver and the sim probe: heartbeats
arrive live on the node's subject (and are never stored), an injected XID shows in the next heartbeat's alerts
and on /metrics, and a fence destroys an instance and forgets it. The tests play the scheduler and the gateway."""
from __future__ import annotations

import asyncio
import json
import uuid
from functools import partial

import aiohttp
import pytest
from nats.js.errors import NotFoundError

from services.node_agent.adapters.drivers import SimDriver
from services.node_agent.bootstrap import build
from tests.support.bus import make_envelope, of
from tests.support.bus import send_to_node as send
from tests.support.commands import provision_node_cmd

STREAM = "TESSERA_NODE_AGENT"


class Heartbeats:
    """The node's heartbeats as they arrive on a plain subscription (they are in no stream)."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[dict] = asyncio.Queue()

    async def on(self, msg) -> None:
        self.queue.put_nowait(json.loads(msg.data))

    async def next_where(self, pick, timeout_s: float = 10.0) -> dict:
        """The data of the next heartbeat ``pick`` accepts."""
        async with asyncio.timeout(timeout_s):
            while True:
                beat = (await self.queue.get())["data"]
                if pick(beat):
                    return beat


@pytest.fixture
async def node(run_service, nc, watch):
    """A sim node sending a heartbeat every 0.2 s: (node id, runtime, driver, heartbeats, its events)."""
    node_id, driver = uuid.uuid4(), SimDriver()
    beats = Heartbeats()
    sub = await nc.subscribe(f"node_agent.evt.heartbeat.{node_id}", cb=beats.on)
    events = await watch(f"node_agent.evt.*.{node_id}")
    rt = await run_service("node_agent", partial(build, driver=driver, environ={"TESSERA_NODE_HEARTBEAT_S": "0.2"}),
                           instance=str(node_id))
    yield node_id, rt, driver, beats, events
    await sub.unsubscribe()


async def command(nc, verb: str, node_id: uuid.UUID, data: dict) -> None:
    env = make_envelope(f"node_agent.{verb}", json.loads(json.dumps(data, default=str)), correlation_id=str(node_id))
    await send(nc.jetstream(), verb, node_id, data, env=env)


async def test_heartbeats_arrive_live_in_sequence_and_an_injected_xid_shows_in_the_next(node, nc):
    node_id, rt, _, beats, events = node
    first = await beats.next_where(lambda b: True)
    second = await beats.next_where(lambda b: True)
    assert first["node_id"] == str(node_id) and second["seq"] == first["seq"] + 1
    assert first["started_at"] == second["started_at"] and first["alerts"] == []
    assert [g["gpu"] for g in first["gpus"]] == list(range(8))   # the sim topology's GPUs
    with pytest.raises(NotFoundError):   # live: never stored in the node-agents' stream
        await nc.jetstream().get_last_msg(STREAM, f"node_agent.evt.heartbeat.{node_id}")

    request = uuid.uuid4()
    await command(nc, "inject_fault", node_id, {"node_id": node_id, "kind": "xid", "gpu": 2, "code": 79,
                                                "request_id": request})
    [(_, answer, _)] = await events.wait_for(lambda i: i[1]["type"] == "node_agent.fault_injected")
    assert answer["data"]["accepted"] is True and answer["data"]["request_id"] == str(request)
    beat = await beats.next_where(lambda b: b["alerts"])
    [alert] = beat["alerts"]
    assert (alert["source"], alert["target"], alert["condition"]) == ("sim", "gpu:2", "xid:79")
    assert beat["gpus"][2]["xid_errors"] == 79
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{rt.port}/metrics") as resp:
        text = await resp.text()
    assert f'DCGM_FI_DEV_XID_ERRORS{{allocation="",gpu="2",node="{node_id}"}} 79.0' in text

    await command(nc, "inject_fault", node_id, {"node_id": node_id, "kind": "clear", "request_id": uuid.uuid4()})
    await beats.next_where(lambda b: not b["alerts"])


async def test_a_fence_destroys_the_instance_and_forgets_it(node, nc):
    node_id, rt, driver, beats, events = node
    alloc = uuid.uuid4()
    await send(nc.jetstream(), "provision", node_id, provision_node_cmd(node_id, alloc, uuid.uuid4()))
    await events.wait_for(of(alloc, "node_agent.node_provisioned"))
    # slots 0 and 1 carry it. A heartbeat composed while the provision committed may list the driver's instance
    # before the records name its GPUs (the records are read first), so the one to wait for is the first that
    # shows both: none within the wait fails the test.
    await beats.next_where(lambda b: str(alloc) in b["instances"]
                           and {g["allocation_id"] for g in b["gpus"][:2]} == {str(alloc)})

    await command(nc, "fence_instances", node_id, {"node_id": node_id, "allocation_ids": [alloc],
                                                   "reason": "the allocation moved to another node"})
    [(_, fenced, _)] = await events.wait_for(lambda i: i[1]["type"] == "node_agent.instances_fenced")
    assert fenced["data"]["allocation_ids"] == [str(alloc)]
    assert await driver.list_instances() == []
    async with rt.pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM instances WHERE node_id = $1", node_id) == 0
    await beats.next_where(lambda b: b["instances"] == [] and b["gpus"][0]["allocation_id"] is None)
