"""The fence_node step on a node-agent over real NATS JetStream and PostgreSQL: addressed to the node's own
subject, answered node_fenced once per key, and the instance, its row and its kept command gone."""
from __future__ import annotations

import uuid
from functools import partial

from services.node_agent.adapters.drivers import SimDriver
from services.node_agent.bootstrap import build
from shared.wire import step_key
from tests.support.bus import of
from tests.support.bus import send_to_node as send
from tests.support.commands import provision_node_cmd


def fence_node_cmd(node_id, alloc, saga) -> dict:
    return {"saga_id": saga, "step": "fence_node", "idempotency_key": step_key(saga, "fence_node"),
            "allocation_id": alloc, "tenant_id": uuid.uuid4(), "node_id": node_id}


async def test_a_fence_removes_the_allocation_from_its_old_node_and_is_answered_once_per_key(run_service, nc, watch):
    node_id, driver, alloc, js = uuid.uuid4(), SimDriver(), uuid.uuid4(), nc.jetstream()
    rt = await run_service("node_agent", partial(build, driver=driver, environ={}), instance=str(node_id))
    replies = await watch(f"node_agent.evt.*.{node_id}")
    await send(js, "provision", node_id, provision_node_cmd(node_id, alloc, uuid.uuid4()))
    await replies.wait_for(of(alloc, "node_agent.node_provisioned"))

    saga = uuid.uuid4()
    await send(js, "fence_node", node_id, fence_node_cmd(node_id, alloc, saga))
    [item] = await replies.wait_for(of(alloc, "node_agent.node_fenced"))
    subject, fenced = item[0], item[1]
    assert subject == f"node_agent.evt.node_fenced.{node_id}"
    assert fenced["data"]["power_state"] == "off" and fenced["data"]["node_id"] == str(node_id)
    assert await driver.list_instances() == []
    async with rt.pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM instances WHERE node_id=$1 AND allocation_id=$2",
                                   node_id, alloc) == 0

    # the same key again (the coordinator resending): the recorded answer, the driver not asked
    driver.fail = frozenset({"deprovision"})
    env, _ = await send(js, "fence_node", node_id, fence_node_cmd(node_id, alloc, saga))
    [again] = await replies.wait_for(lambda i: i[1]["causation_id"] == str(env.id))
    assert again[1]["type"] == "node_agent.node_fenced"
