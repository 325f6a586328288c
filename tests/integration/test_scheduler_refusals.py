"""Admin commands the scheduler can never apply (sent on the bus directly, bypassing the gateway's validation):
data PostgreSQL refuses, such as a NUL in a text field. Each is answered ``scheduler.admin_command_rejected``
naming its target and the target's kind at once: acknowledged on its first delivery (the retry backoff here is
far longer than the wait), nothing stored, and the scheduler goes on deciding."""
from __future__ import annotations

import uuid

from services.node_agent.adapters.discovery.sim import sim_topology
from shared.settings import BusSettings
from tests.support.bus import caused_by, wait_acked
from tests.support.bus import send_command as send
from tests.support.scheduler import start

# a retry would come a minute later: a rejection seen within REFUSED_WITHIN_S came from the first delivery
SLOW_RETRIES = BusSettings(ack_wait_s=5, max_deliver=3, retry_backoff_s=[60.0])
REFUSED_WITHIN_S = 15.0


async def refused(env, type_: str, data: dict) -> dict:
    """Send the command; wait for its one answer, a rejection, and for its consumer to have acked it."""
    cmd, seq = await send(env.js, type_, data)
    [hit] = await env.events.wait_for(caused_by(cmd), REFUSED_WITHIN_S)
    assert hit[1]["type"] == "scheduler.admin_command_rejected", hit
    await wait_acked(env.js, "TESSERA_SCHEDULER", f"scheduler__{type_.replace('.', '_')}", seq,
                     timeout=REFUSED_WITHIN_S)
    return hit[1]["data"]


async def test_a_node_registered_with_a_nul_in_its_region_is_rejected_at_once_and_can_register_again(
        run_service, nc, watch):
    env = await start(run_service, nc, watch, bus=SLOW_RETRIES)
    node = uuid.uuid4()
    declaration = {"node_id": node, "name": f"n-{node.hex[:16]}", "gpu_model": "H100", "gpu_count": 8,
                   "pool": env.pool, "region": "eu\x00west"}
    rejection = await refused(env, "scheduler.register_node", declaration)
    assert (rejection["command"], rejection["target"], rejection["target_kind"]) == (
        "scheduler.register_node", str(node), "node")
    assert "CharacterNotInRepertoireError" in rejection["reason"]
    async with env.rt.pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM nodes WHERE id=$1", node) == 0
    # the refusal changed nothing: the same node, declared correctly, onboards
    await send(env.js, "scheduler.register_node", {**declaration, "region": "eu-west"})
    await env.report(node, sim_topology(f"n-{node.hex}").to_dict())
    # (declaration and report may arrive in either order)
    doc = await env.node_event(node, lambda d: d["status"] == "pending_approval" and d["region"] == "eu-west")
    assert doc["name"] == declaration["name"] and doc["pool"] == env.pool


async def test_pool_shape_and_quota_commands_with_data_postgres_refuses_are_rejected_at_once_naming_their_kind(
        run_service, nc, watch):
    env = await start(run_service, nc, watch, bus=SLOW_RETRIES)
    pool = f"p-{uuid.uuid4().hex[:12]}"
    rejection = await refused(env, "scheduler.define_pool", {"name": pool, "description": "spot\x00capacity"})
    assert (rejection["target"], rejection["target_kind"]) == (pool, "pool")
    assert "CharacterNotInRepertoireError" in rejection["reason"]

    shape = f"s-{uuid.uuid4().hex[:8]}"
    rejection = await refused(env, "scheduler.define_shape", {"name": shape, "kind": "vm", "gpu_count": 2,
                                                              "gpu_model": "H\x00100"})
    assert (rejection["target"], rejection["target_kind"]) == (shape, "shape")

    tenant = uuid.uuid4()
    rejection = await refused(env, "scheduler.set_quota", {"tenant_id": tenant, "gpu_model": "H\x00100",
                                                           "pool": env.pool, "limit": 8, "set_by": uuid.uuid4()})
    assert rejection["target_kind"] == "quota" and rejection["target"] == f"{tenant}/H\\x00100/{env.pool}"
    async with env.rt.pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM pools WHERE name=$1", pool) == 0
        assert await conn.fetchval("SELECT count(*) FROM shapes WHERE name=$1", shape) == 0
        assert await conn.fetchval("SELECT count(*) FROM quotas WHERE tenant_id=$1", tenant) == 0

    # a refusal the scheduler decides names its kind too, and the scheduler still decides
    rejection = await refused(env, "scheduler.update_node", {"node_id": uuid.uuid4(), "cordoned": True,
                                                             "requested_by": uuid.uuid4()})
    assert rejection["target_kind"] == "node" and "unknown node" in rejection["reason"]
    await env.grant(tenant, 8)
    await env.onboard()
    placed = await env.reserve(tenant, "vm.2gpu", fail_fast=True)
    assert placed["type"] == "scheduler.slots_reserved"
