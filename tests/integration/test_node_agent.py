"""The node-agent against real NATS JetStream and PostgreSQL: per-node subjects, redelivery, tombstones,
driver failures, slow steps, and the instance gauge."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from functools import partial
from pathlib import Path

import aiohttp
import pytest

from services.node_agent.adapters.drivers import SimDriver
from services.node_agent.bootstrap import build
from shared.settings import BusSettings
from shared.wire import step_key
from tests.support.bus import of, wait_acked
from tests.support.bus import send_to_node as send
from tests.support.commands import deprovision_node_cmd, provision_node_cmd

STREAM = "TESSERA_NODE_AGENT"
REPO = Path(__file__).resolve().parents[2]


class Node:
    def __init__(self, rt, node_id: uuid.UUID, driver: SimDriver):
        self.rt, self.id, self.driver = rt, node_id, driver

    def durable(self, verb: str) -> str:
        return f"node_agent_{self.id.hex}__{verb}"

    async def instances(self, alloc: uuid.UUID) -> list:
        return [i for i in await self.driver.list_instances() if i.allocation_id == alloc]

    async def rows(self, alloc: uuid.UUID) -> int:
        async with self.rt.pool.acquire() as conn:
            return await conn.fetchval("SELECT count(*) FROM instances WHERE node_id=$1 AND allocation_id=$2", self.id, alloc)


@pytest.fixture
def start_node(run_service):
    async def _start(driver: SimDriver | None = None, node_id: uuid.UUID | None = None, **overrides) -> Node:
        node_id, driver = node_id or uuid.uuid4(), driver or SimDriver()
        rt = await run_service("node_agent", partial(build, driver=driver, environ={}), instance=str(node_id), **overrides)
        return Node(rt, node_id, driver)
    return _start


async def gauge(node: Node) -> float:
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{node.rt.port}/metrics") as resp:
        text = await resp.text()
    line = next(ln for ln in text.splitlines() if ln.startswith(f'tessera_node_instances{{node_id="{node.id}"}}'))
    return float(line.split()[-1])


async def test_redelivered_provision_command_provisions_once_and_replays_the_same_instance(start_node, nc, watch):
    node, alloc, saga, js = await start_node(), uuid.uuid4(), uuid.uuid4(), nc.jetstream()
    replies = await watch(f"node_agent.evt.*.{node.id}")
    env, _ = await send(js, "provision", node.id, provision_node_cmd(node.id, alloc, saga))
    # the same envelope under another Nats-Msg-Id: the server cannot dedupe it, the inbox must
    _, seq = await send(js, "provision", node.id, {}, env=env, msg_id=f"again-{env.id}")
    [first] = await replies.wait_for(of(alloc, "node_agent.node_provisioned"))
    assert first[0] == f"node_agent.evt.node_provisioned.{node.id}"
    await wait_acked(js, STREAM, node.durable("provision"), seq)
    assert len(await node.instances(alloc)) == 1 and await node.rows(alloc) == 1
    async with node.rt.pool.acquire() as conn:
        caused = await conn.fetchval(
            "SELECT count(*) FROM outbox WHERE convert_from(body, 'UTF8')::jsonb->>'causation_id' = $1", str(env.id))
    assert caused == 1
    # a distinct command with the same idempotency key re-answers with the same instance, and the driver is not asked
    node.driver.fail = frozenset({"provision"})
    env3, _ = await send(js, "provision", node.id, provision_node_cmd(node.id, alloc, saga))
    [again] = await replies.wait_for(lambda i: i[1]["causation_id"] == str(env3.id))
    assert again[1]["type"] == "node_agent.node_provisioned"
    assert again[1]["data"]["instance_id"] == first[1]["data"]["instance_id"]


async def test_deprovision_of_a_key_that_never_ran_makes_its_later_provision_fail_with_no_instance(start_node, nc, watch):
    node, alloc, saga, js = await start_node(), uuid.uuid4(), uuid.uuid4(), nc.jetstream()
    replies = await watch(f"node_agent.evt.*.{node.id}")
    compensates = step_key(saga, "provision_node")
    await send(js, "deprovision", node.id, deprovision_node_cmd(node.id, alloc, saga, compensates=compensates))
    await replies.wait_for(of(alloc, "node_agent.node_deprovisioned"))
    await send(js, "provision", node.id, provision_node_cmd(node.id, alloc, saga))
    [failed] = await replies.wait_for(of(alloc, "node_agent.node_provision_failed"))
    assert "compensated" in failed[1]["data"]["reason"]
    assert await node.instances(alloc) == [] and await node.rows(alloc) == 0


async def test_node_agent_ignores_commands_for_another_node_which_stay_for_that_nodes_consumer(start_node, nc, watch):
    here, js = await start_node(), nc.jetstream()
    other_id, other_alloc, mine = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    replies = await watch("node_agent.evt.>")
    await send(js, "provision", other_id, provision_node_cmd(other_id, other_alloc, uuid.uuid4()))
    _, seq = await send(js, "provision", here.id, provision_node_cmd(here.id, mine, uuid.uuid4()))
    await replies.wait_for(of(mine, "node_agent.node_provisioned"))
    info = await wait_acked(js, STREAM, here.durable("provision"), seq)
    assert info.delivered.consumer_seq == 1          # only its own command was ever delivered to this node
    assert await here.instances(other_alloc) == [] and await here.rows(other_alloc) == 0
    other = await start_node(node_id=other_id)       # the other node's consumer, created later, still gets it
    [hit] = await replies.wait_for(of(other_alloc, "node_agent.node_provisioned"))
    assert hit[0] == f"node_agent.evt.node_provisioned.{other_id}"
    assert len(await other.instances(other_alloc)) == 1 and await other.rows(other_alloc) == 1


async def test_driver_failure_replies_provision_failed_with_the_drivers_message_and_records_nothing(start_node, nc, watch):
    node, alloc, saga = await start_node(SimDriver(fail=["provision"])), uuid.uuid4(), uuid.uuid4()
    replies = await watch(f"node_agent.evt.*.{node.id}")
    await send(nc.jetstream(), "provision", node.id, provision_node_cmd(node.id, alloc, saga))
    [failed] = await replies.wait_for(of(alloc, "node_agent.node_provision_failed"))
    assert failed[1]["data"]["reason"] == "sim driver: injected failure of provision"
    assert await node.rows(alloc) == 0 and await node.instances(alloc) == []


async def test_provision_without_slots_fails_clearly_and_leaves_nothing(start_node, nc, watch):
    node, alloc = await start_node(), uuid.uuid4()
    replies = await watch(f"node_agent.evt.*.{node.id}")
    await send(nc.jetstream(), "provision", node.id, provision_node_cmd(node.id, alloc, uuid.uuid4(), slots=()))
    [failed] = await replies.wait_for(of(alloc, "node_agent.node_provision_failed"))
    assert "no slots" in failed[1]["data"]["reason"]
    assert await node.rows(alloc) == 0 and await node.instances(alloc) == []


async def test_fault_label_fails_the_step_only_when_sim_faults_are_on(start_node, nc, watch):
    node, alloc = await start_node(sim_faults=True), uuid.uuid4()
    replies = await watch(f"node_agent.evt.*.{node.id}")
    labels = {"sim.tessera.io/fault": "provision_node=fail"}
    await send(nc.jetstream(), "provision", node.id, provision_node_cmd(node.id, alloc, uuid.uuid4(), labels=labels))
    [failed] = await replies.wait_for(of(alloc, "node_agent.node_provision_failed"))
    assert "injected fault at provision_node" in failed[1]["data"]["reason"]
    assert await node.instances(alloc) == []


class RendezvousDriver(SimDriver):
    """Each provision waits inside the driver until ``parties`` provisions are there at once:
    a node-agent that handles commands one after another never gets past the first."""

    def __init__(self, parties: int):
        super().__init__()
        self.barrier = asyncio.Barrier(parties)

    async def provision(self, spec):
        await self.barrier.wait()
        return await super().provision(spec)


async def test_a_slow_provision_does_not_block_other_commands_to_the_node(start_node, nc, watch):
    node, allocs = await start_node(RendezvousDriver(3)), [uuid.uuid4() for _ in range(3)]
    replies = await watch(f"node_agent.evt.*.{node.id}")
    for alloc in allocs:
        await send(nc.jetstream(), "provision", node.id, provision_node_cmd(node.id, alloc, uuid.uuid4()))
    for alloc in allocs:
        await replies.wait_for(of(alloc, "node_agent.node_provisioned"))


class SignallingDriver(SimDriver):
    """Sets ``entered`` when a provision is inside the driver, which then takes ``latency_s``."""

    def __init__(self, latency_s: float):
        super().__init__({"provision": latency_s})
        self.entered = asyncio.Event()

    async def provision(self, spec):
        self.entered.set()
        return await super().provision(spec)


async def test_compensation_arriving_while_the_provision_is_in_the_driver_leaves_nothing_behind(start_node, nc, watch):
    node, alloc, saga, js = await start_node(SignallingDriver(1.5)), uuid.uuid4(), uuid.uuid4(), nc.jetstream()
    replies = await watch(f"node_agent.evt.*.{node.id}")
    await send(js, "provision", node.id, provision_node_cmd(node.id, alloc, saga))
    await asyncio.wait_for(node.driver.entered.wait(), 20)
    undo = deprovision_node_cmd(node.id, alloc, saga, compensates=step_key(saga, "provision_node"))
    await send(js, "deprovision", node.id, undo)
    await replies.wait_for(of(alloc, "node_agent.node_deprovisioned"))
    provisioned, refused = of(alloc, "node_agent.node_provisioned"), of(alloc, "node_agent.node_provision_failed")
    await replies.wait_for(lambda i: provisioned(i) or refused(i))
    assert await node.instances(alloc) == [] and await node.rows(alloc) == 0


async def test_provision_slower_than_ack_wait_is_kept_alive_by_heartbeats_not_redelivered(start_node, nc, watch):
    bus = BusSettings(ack_wait_s=1.5, max_deliver=3, retry_backoff_s=[0.05])
    node, alloc, js = await start_node(SimDriver({"provision": 3.5}), bus=bus), uuid.uuid4(), nc.jetstream()
    replies = await watch(f"node_agent.evt.*.{node.id}")
    _, seq = await send(js, "provision", node.id, provision_node_cmd(node.id, alloc, uuid.uuid4()))
    await replies.wait_for(of(alloc, "node_agent.node_provisioned"))
    info = await wait_acked(js, STREAM, node.durable("provision"), seq)
    assert (info.num_redelivered, info.delivered.consumer_seq) == (0, 1)


async def test_deprovision_removes_instance_and_row_and_the_gauge_follows(start_node, nc, watch):
    node, kept, gone, js = await start_node(), uuid.uuid4(), uuid.uuid4(), nc.jetstream()
    replies = await watch(f"node_agent.evt.*.{node.id}")
    for alloc in (kept, gone):
        await send(js, "provision", node.id, provision_node_cmd(node.id, alloc, uuid.uuid4()))
        await replies.wait_for(of(alloc, "node_agent.node_provisioned"))
    assert await gauge(node) == 2
    await send(js, "deprovision", node.id, deprovision_node_cmd(node.id, gone, uuid.uuid4()))
    await replies.wait_for(of(gone, "node_agent.node_deprovisioned"))
    assert await node.rows(gone) == 0 and await node.instances(gone) == []
    assert await node.rows(kept) == 1 and await gauge(node) == 1
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{node.rt.port}/readyz") as resp:
        assert resp.status == 200


async def test_deprovision_the_driver_cannot_do_is_dead_lettered_and_keeps_the_instance(start_node, nc, watch):
    node, alloc, js = await start_node(), uuid.uuid4(), nc.jetstream()
    replies = await watch(f"node_agent.evt.*.{node.id}")
    dead = await watch(f"deadletter.node_agent.{node.durable('deprovision')}")
    await send(js, "provision", node.id, provision_node_cmd(node.id, alloc, uuid.uuid4()))
    await replies.wait_for(of(alloc, "node_agent.node_provisioned"))
    node.driver.fail = frozenset({"deprovision"})
    await send(js, "deprovision", node.id, deprovision_node_cmd(node.id, alloc, uuid.uuid4()))
    [hit] = await dead.wait_for(lambda i: i[1]["data"]["allocation_id"] == str(alloc))
    assert hit[2]["Tessera-DLQ-Reason"] == "max_deliveries"
    assert "injected failure of deprovision" in hit[2]["Tessera-DLQ-Error"]
    assert await node.rows(alloc) == 1 and len(await node.instances(alloc)) == 1


async def test_command_whose_payload_names_another_node_is_dead_lettered_untouched(start_node, nc, watch):
    node, alloc = await start_node(), uuid.uuid4()
    dead = await watch(f"deadletter.node_agent.{node.durable('provision')}")
    await send(nc.jetstream(), "provision", node.id, provision_node_cmd(uuid.uuid4(), alloc, uuid.uuid4()))
    [hit] = await dead.wait_for(lambda i: i[1]["data"]["allocation_id"] == str(alloc))
    assert hit[2]["Tessera-DLQ-Reason"] == "rejected" and f"arrived at node {node.id}" in hit[2]["Tessera-DLQ-Error"]
    assert await node.rows(alloc) == 0 and await node.instances(alloc) == []


@pytest.mark.parametrize("node_env, message", [({}, "must be set"), ({"TESSERA_NODE_ID": "node-7"}, "is not a UUID")])
def test_node_agent_process_exits_with_a_message_without_a_valid_node_id(node_env, message):
    env = {k: v for k, v in os.environ.items() if k not in ("TESSERA_NODE_ID", "TESSERA_INSTANCE")} | node_env
    proc = subprocess.run([sys.executable, "-m", "services.node_agent"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "TESSERA_NODE_ID" in proc.stderr and message in proc.stderr
