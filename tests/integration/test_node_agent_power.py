"""The node-agent's power actions against real NATS JetStream and PostgreSQL, over the sim driver: carried out
and answered, refused (with the reason) for an allocation that is not on the node, and refused without acting
once past the command's deadline. The tests play the gateway: they send node_agent.power on the node's subject."""
from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from functools import partial

import pytest

from services.node_agent.adapters.drivers import SimDriver
from services.node_agent.bootstrap import build
from shared.envelope import utcnow
from tests.support.bus import of
from tests.support.bus import send_to_node as send
from tests.support.commands import provision_node_cmd


class Node:
    def __init__(self, rt, node_id: uuid.UUID, driver: SimDriver):
        self.rt, self.id, self.driver = rt, node_id, driver

    async def running(self, alloc: uuid.UUID) -> bool:
        """Whether the sim instance runs (its console says so; a stopped one does not)."""
        return (await self.driver.console(alloc, -1, 1024)).running


@pytest.fixture
def start_node(run_service):
    async def _start() -> Node:
        node_id, driver = uuid.uuid4(), SimDriver()
        rt = await run_service("node_agent", partial(build, driver=driver, environ={}), instance=str(node_id))
        return Node(rt, node_id, driver)
    return _start


@pytest.fixture
async def provisioned(start_node, nc, watch):
    """A node, its event watcher, and an allocation provisioned on it through the bus: (node, replies, command)."""
    node, alloc = await start_node(), uuid.uuid4()
    replies = await watch(f"node_agent.evt.*.{node.id}")
    cmd = provision_node_cmd(node.id, alloc, uuid.uuid4())
    await send(nc.jetstream(), "provision", node.id, cmd)
    await replies.wait_for(of(alloc, "node_agent.node_provisioned"))
    return node, replies, cmd


def power_cmd(provision: dict, action: str, *, expires_at: datetime | None = None, **over) -> dict:
    """node_agent.power as the gateway sends it, for the provisioned allocation (its tenant), due in 5 minutes."""
    return {"request_id": uuid.uuid4(), "allocation_id": provision["allocation_id"],
            "tenant_id": provision["tenant_id"], "node_id": provision["node_id"], "action": action,
            "requested_by": uuid.uuid4(), "expires_at": expires_at or utcnow() + timedelta(minutes=5), **over}


async def answer_to(nc, replies, node, cmd: dict) -> dict:
    """Send the power command to the node; its power_changed answer (the data)."""
    await send(nc.jetstream(), "power", node.id, cmd)
    [(subject, env, _)] = await replies.wait_for(
        lambda i: i[1]["type"] == "node_agent.power_changed" and i[1]["data"]["request_id"] == str(cmd["request_id"]))
    assert subject == f"node_agent.evt.power_changed.{node.id}"
    return env["data"]


async def test_a_power_action_is_carried_out_by_the_driver_and_answered_ok(provisioned, nc):
    node, replies, provision = provisioned
    alloc = provision["allocation_id"]
    stopped = await answer_to(nc, replies, node, power_cmd(provision, "stop"))
    assert stopped["ok"] is True and stopped["power_state"] == "stopped" and stopped["reason"] is None
    assert not await node.running(alloc)
    started = await answer_to(nc, replies, node, power_cmd(provision, "start"))
    assert started["ok"] is True and started["power_state"] == "running" and await node.running(alloc)


async def test_a_power_action_for_an_allocation_not_on_the_node_is_refused_with_the_reason(provisioned, nc):
    node, replies, provision = provisioned
    elsewhere = uuid.uuid4()
    refused = await answer_to(nc, replies, node, power_cmd(provision, "reboot", allocation_id=elsewhere))
    assert refused["ok"] is False and refused["power_state"] == "unknown"
    assert refused["reason"] == f"allocation {elsewhere} has no instance on node {node.id}"
    # another tenant's allocation on this node is not its own either
    stranger = await answer_to(nc, replies, node, power_cmd(provision, "stop", tenant_id=uuid.uuid4()))
    assert stranger["ok"] is False and "has no instance on node" in stranger["reason"]
    assert await node.running(provision["allocation_id"])


async def test_an_expired_power_action_is_refused_without_acting(provisioned, nc):
    node, replies, provision = provisioned
    alloc = provision["allocation_id"]
    deadline = utcnow() - timedelta(seconds=1)
    refused = await answer_to(nc, replies, node, power_cmd(provision, "stop", expires_at=deadline))
    assert refused["ok"] is False
    assert refused["reason"].startswith("expired: the node received it at ")
    assert refused["reason"].endswith(f", after its deadline {deadline.isoformat()}")
    received = datetime.fromisoformat(refused["reason"].removeprefix("expired: the node received it at ").split(",")[0])
    assert received > deadline
    assert await node.running(alloc)   # the sim instance was not stopped
    # the same action within its deadline is carried out
    assert (await answer_to(nc, replies, node, power_cmd(provision, "stop")))["ok"] is True
    assert not await node.running(alloc)


async def test_a_power_action_addressed_to_another_node_is_refused_at_once_not_left_pending(provisioned, nc):
    """A payload naming another node on this node's subject (forged, or misrouted) can never be carried out here:
    it is answered ok=false with the reason at once, so its action does not wait for the gateway's deadline."""
    node, replies, provision = provisioned
    other = uuid.uuid4()
    refused = await answer_to(nc, replies, node, power_cmd(provision, "stop", node_id=other))
    assert refused["ok"] is False and refused["node_id"] == str(node.id)
    assert f"power action for node {other} arrived at node {node.id}" in refused["reason"]
    assert await node.running(provision["allocation_id"]), "nothing was done"
