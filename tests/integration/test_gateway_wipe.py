"""Wipe-on-release, quarantine and burn-in through the gateway: the evidence of an allocation's slot wipes
(node_agent.slots_wiped, node_agent.slot_rewiped, projected from every node), a quarantined slot re-wiped
(node_agent.rewipe), and a node's burn-in re-run (scheduler.run_burn_in) with its run on the node's document. The
tests play the node-agents and the scheduler: they publish their events and watch the gateway's commands."""
from __future__ import annotations

import uuid

from shared.envelope import utcnow
from tests.support.gateway import SLOT_MAP, node_doc, outbox_count, project, project_from_node

AT = "2030-01-01T00:00:00Z"
FULL_MAP = {"slots": [{"index": i, "gpu_index": i, "gpu_pci": f"0000:{i + 0x10:02x}:00.0", "gpu_model": "H100",
                       "nvme_pci": f"0000:{i + 0x40:02x}:00.0", "ib_vf_pci": f"0000:{i + 0x80:02x}:00.1",
                       "ib_guid": f"0x{i:016x}", "numa": i // 4, "nvlink_domain": 0, "cpu_cores": 12, "memory_gb": 240,
                       "mig_capable": True, "wipe_policy": "nvme-format-crypto"} for i in range(8)]}


def evidence(slot: int, ok: bool = True, reason: str | None = None) -> dict:
    """node_agent's SlotWipe of one slot."""
    return {"slot": slot, "ok": ok, "reason": reason, "policy": "nvme-format-crypto", "gpu_reset": "nvidia-smi -r: ok",
            "devices": [{"device": f"/dev/nvme{slot}n1", "method": "nvme-format-crypto", "bytes": 3_840_000_000_000,
                         "duration_s": 4.2, "verified": ok, "verification": "sampled 1024 blocks: all zero" if ok
                         else "sampled 1024 blocks: 3 not zero", "ok": ok, "reason": reason,
                         "commands": [f"nvme format /dev/nvme{slot}n1 --ses=2"]}],
            "started_at": AT, "finished_at": AT, "duration_s": 4.5, "agent_version": "0.12.0"}


async def allocation_on(api, nc, node_id: uuid.UUID) -> tuple[object, str, dict]:
    """(client, tenant id, allocation) of a new tenant whose allocation is ACTIVE on ``node_id``."""
    client, tenant_id = await api.tenant_user()
    a = (await client.post("/v1/allocations", {"name": "train", "shape": "vm.1gpu"})).body
    saga = uuid.uuid4()
    await project(api, nc, "allocation.activated", {
        "allocation_id": a["id"], "tenant_id": tenant_id, "state": "ACTIVE", "at": AT, "saga_id": saga,
        "step": "activate", "idempotency_key": f"{saga}:activate", "node_id": node_id}, tenant_id)
    return client, tenant_id, a


async def release(api, nc, a: dict, tenant_id: str) -> None:
    await project(api, nc, "allocation.release_requested", {"allocation_id": a["id"], "tenant_id": tenant_id,
                  "state": "RELEASING", "at": AT, "requested_by": uuid.uuid4()}, tenant_id)


def wiped(a: dict, node_id: uuid.UUID, slots: list[dict], quarantine: list[dict] | None = None) -> dict:
    """node_agent.slots_wiped: the release saga's wipe_slots reply."""
    saga = uuid.uuid4()
    return {"saga_id": saga, "step": "wipe_slots", "idempotency_key": f"{saga}:wipe_slots", "allocation_id": a["id"],
            "node_id": node_id, "evidence": slots, "quarantine": quarantine or []}


async def wipe_of(client, a: dict) -> dict:
    r = await client.get(f"/v1/allocations/{a['id']}/wipe")
    assert r.status == 200, r.body
    return r.body


# --- the evidence of a release's wipe ----------------------------------------------------------------------------

async def test_the_wipe_follows_the_release_and_shows_each_slots_evidence(api, nc):
    node = uuid.uuid4()
    client, tenant_id, a = await allocation_on(api, nc, node)
    assert await wipe_of(client, a) == {"allocation_id": a["id"], "status": "not_released", "node_id": str(node),
                                        "slots": [], "wiped_at": None}
    await release(api, nc, a, tenant_id)
    assert (await wipe_of(client, a))["status"] == "wiping"
    report = await project_from_node(api, nc, "node_agent.slots_wiped", node, wiped(a, node, [evidence(0), evidence(1)]))
    shown = await wipe_of(client, a)
    assert shown["status"] == "wiped" and shown["node_id"] == str(node) and shown["wiped_at"]
    assert [s["slot"] for s in shown["slots"]] == [0, 1]
    first = shown["slots"][0]
    assert first["ok"] is True and first["source"] == "release" and first["rewipe_request_id"] is None
    assert first["devices"] == evidence(0)["devices"] and first["policy"] == "nvme-format-crypto"
    assert (first["duration_s"], first["agent_version"], first["gpu_reset"]) == (4.5, "0.12.0", "nvidia-smi -r: ok")
    # the report is an event of the allocation's stream; a repeated report changes nothing
    assert await api.scalar("SELECT type FROM allocation_events WHERE event_id=$1", report.id) == "node_agent.slots_wiped"
    await project_from_node(api, nc, "node_agent.slots_wiped", node, wiped(a, node, [evidence(0, False, "late")]))
    assert await wipe_of(client, a) == shown
    # a provider admin reads it too; another tenant, a malformed id or an unknown one: 404
    assert (await (await api.admin()).get(f"/v1/allocations/{a['id']}/wipe")).body == shown
    other, _ = await api.tenant_user()
    for who, path in ((other, a["id"]), (client, "not-an-id"), (client, str(uuid.uuid4()))):
        r = await who.get(f"/v1/allocations/{path}/wipe")
        assert r.status == 404 and r.content_type == "application/problem+json"
    assert (await api.anonymous().get(f"/v1/allocations/{a['id']}/wipe")).status == 401


async def test_a_failed_wipe_quarantines_the_slot_until_a_rewipe_passes(api, nc, watch):
    admin = await api.admin()
    node, name = uuid.uuid4(), f"node-{uuid.uuid4().hex[:8]}"
    client, tenant_id, a = await allocation_on(api, nc, node)
    await release(api, nc, a, tenant_id)
    reason = "verification failed: 3 of 1024 sampled blocks not zero"
    await project_from_node(api, nc, "node_agent.slots_wiped", node, wiped(
        a, node, [evidence(1), evidence(2, False, reason)], [{"slot": 2, "reason": reason}]))
    shown = await wipe_of(client, a)
    assert shown["status"] == "quarantined"
    assert [(s["slot"], s["ok"], s["reason"]) for s in shown["slots"]] == [(1, True, None), (2, False, reason)]
    # the scheduler keeps the slot out of service: the node's document lists it
    doc = dict(status="schedulable", proposal=None, approved_slot_map=FULL_MAP, free_slots=6,
               quarantined=[{"slot": 2, "reason": reason, "since": AT}])
    await project(api, nc, "scheduler.node_changed", node_doc(str(node), name, 1, **doc))
    assert (await admin.get(f"/v1/nodes/{node}")).body["quarantined"] == [
        {"slot": 2, "reason": reason, "since": "2030-01-01T00:00:00Z"}]
    # only a quarantined slot is re-wiped
    commands = await watch(f"node_agent.cmd.rewipe.{node}")
    r = await admin.post(f"/v1/nodes/{node}/slots/3/rewipe")
    assert r.status == 409 and r.body["type"].endswith("/slot-not-quarantined")
    first = await admin.post(f"/v1/nodes/{node}/slots/2/rewipe")
    assert first.status == 202 and first.body["slot"] == 2 and first.body["node_id"] == str(node)
    [(_, cmd, _)] = await commands.wait_for(lambda i: i[1]["data"]["request_id"] == first.body["request_id"])
    assert cmd["type"] == "node_agent.rewipe" and cmd["data"]["requested_by"] == first.body["requested_by"]
    detail = cmd["data"]["slot_detail"]
    assert (detail["index"], detail["nvme_pci"], detail["wipe_policy"]) == (2, "0000:42:00.0", "nvme-format-crypto")
    # a re-wipe that fails keeps it quarantined, with the new evidence; one that passes shows on the allocation
    again = "re-wipe: the namespace is write-protected"
    await project_from_node(api, nc, "node_agent.slot_rewiped", node, {
        **{k: cmd["data"][k] for k in ("request_id", "node_id", "slot", "requested_by")}, "ok": False,
        "evidence": evidence(2, False, again)})
    shown = await wipe_of(client, a)
    assert shown["status"] == "quarantined" and shown["slots"][1]["reason"] == again
    assert shown["slots"][1]["source"] == "rewipe" and shown["slots"][1]["rewipe_request_id"] == first.body["request_id"]
    second = (await admin.post(f"/v1/nodes/{node}/slots/2/rewipe")).body
    await project_from_node(api, nc, "node_agent.slot_rewiped", node, {
        "request_id": second["request_id"], "node_id": str(node), "slot": 2, "requested_by": second["requested_by"],
        "ok": True, "evidence": evidence(2)})
    shown = await wipe_of(client, a)
    assert shown["status"] == "wiped" and [s["ok"] for s in shown["slots"]] == [True, True]
    assert shown["slots"][1]["rewipe_request_id"] == second["request_id"]
    # the scheduler returns the slot: no longer quarantined, so no longer re-wiped
    await project(api, nc, "scheduler.node_changed", node_doc(str(node), name, 2, **{**doc, "quarantined": []}))
    assert (await admin.get(f"/v1/nodes/{node}")).body["quarantined"] == []
    assert (await admin.post(f"/v1/nodes/{node}/slots/2/rewipe")).status == 409
    assert await outbox_count(api, "node_agent.rewipe", "node_id", str(node)) == 2


async def test_rewipe_is_the_provider_admins_and_validates_the_slot(api, nc):
    admin, (user, _) = await api.admin(), await api.tenant_user("tenant_admin")
    node, name = str(uuid.uuid4()), f"node-{uuid.uuid4().hex[:8]}"
    await project(api, nc, "scheduler.node_changed", node_doc(node, name, 1, status="schedulable", proposal=None,
                                                               approved_slot_map=SLOT_MAP,
                                                               quarantined=[{"slot": 0, "reason": "wipe failed"}]))
    assert (await user.post(f"/v1/nodes/{node}/slots/0/rewipe")).status == 403
    assert (await api.anonymous().post(f"/v1/nodes/{node}/slots/0/rewipe")).status == 401
    assert (await admin.post(f"/v1/nodes/{uuid.uuid4()}/slots/0/rewipe")).status == 404
    for slot in ("x", "-1", "1024", "1.0", "0x1"):
        r = await admin.post(f"/v1/nodes/{node}/slots/{slot}/rewipe")
        assert r.status == 422 and r.body["errors"][0]["field"] == "slot", slot
    assert await outbox_count(api, "node_agent.rewipe", "node_id", node) == 0
    # a slot map without a slot's devices (an older document): the re-wipe goes without its detail
    r = await admin.post(f"/v1/nodes/{node}/slots/0/rewipe")
    assert r.status == 202
    body = await api.scalar("SELECT convert_from(body, 'UTF8')::jsonb->'data' FROM outbox WHERE type='node_agent.rewipe' "
                            "AND convert_from(body, 'UTF8')::jsonb->'data'->>'node_id' = $1", node)
    assert '"slot_detail": null' in body


# --- burn-in -----------------------------------------------------------------------------------------------------

async def test_a_burn_in_rerun_is_sent_to_the_scheduler_and_the_node_shows_its_run(api, nc, watch):
    admin, (user, _) = await api.admin(), await api.tenant_user("tenant_admin")
    node, name = str(uuid.uuid4()), f"node-{uuid.uuid4().hex[:8]}"
    commands = await watch("scheduler.cmd.run_burn_in")
    await project(api, nc, "scheduler.node_changed", node_doc(node, name, 1))          # pending approval
    r = await admin.post(f"/v1/nodes/{node}/burn-in")
    assert r.status == 409 and "pending_approval" in r.body["detail"]
    await project(api, nc, "scheduler.node_changed", node_doc(node, name, 2, status="schedulable", proposal=None,
                                                               approved_slot_map=FULL_MAP, free_slots=8))
    assert (await user.post(f"/v1/nodes/{node}/burn-in")).status == 403
    assert (await admin.post(f"/v1/nodes/{uuid.uuid4()}/burn-in")).status == 404
    r = await admin.post(f"/v1/nodes/{node}/burn-in")
    assert r.status == 202 and r.body["id"] == node
    [(_, cmd, _)] = await commands.wait_for(lambda i: i[1]["data"]["node_id"] == node)
    assert cmd["data"] == {"node_id": node, "requested_by": cmd["data"]["requested_by"]} and cmd["data"]["requested_by"]
    run = {"run_id": str(uuid.uuid4()), "state": "running", "checks": [], "requested_by": cmd["data"]["requested_by"],
           "started_at": AT, "finished_at": None}
    await project(api, nc, "scheduler.node_changed", node_doc(node, name, 3, status="burn_in", proposal=None,
                                                               approved_slot_map=FULL_MAP, burn_in=run))
    shown = (await admin.get(f"/v1/nodes/{node}")).body
    assert shown["status"] == "burn_in" and shown["burn_in"]["state"] == "running" and shown["free_slots"] == 0
    checks = [{"name": "gpu-count", "ok": True, "detail": "8 GPUs"},
              {"name": "nccl-allreduce", "ok": False, "detail": "bus bandwidth 12 GB/s < 300"}]
    failed = {**run, "state": "failed", "checks": checks, "finished_at": utcnow().isoformat()}
    review = ["burn-in check nccl-allreduce failed: bus bandwidth 12 GB/s < 300"]
    await project(api, nc, "scheduler.node_changed", node_doc(node, name, 4, status="burn_in_failed", proposal=None,
                                                               approved_slot_map=FULL_MAP, burn_in=failed,
                                                               review=review))
    shown = (await admin.get(f"/v1/nodes/{node}")).body
    assert (shown["status"], shown["review"], shown["burn_in"]["checks"]) == ("burn_in_failed", review, checks)
    assert shown["burn_in"]["run_id"] == run["run_id"] and shown["burn_in"]["finished_at"]
    listed = {n["id"]: n for n in (await admin.get("/v1/nodes")).body["items"]}
    assert listed[node]["status"] == "burn_in_failed"
    assert (await admin.post(f"/v1/nodes/{node}/burn-in")).status == 202              # a failed node is re-run
    assert await outbox_count(api, "scheduler.run_burn_in", "node_id", node) == 2


async def test_wipe_evidence_of_an_allocation_the_gateway_never_saw_is_kept_without_harm(api, nc):
    node, ghost = uuid.uuid4(), {"id": str(uuid.uuid4())}
    await project_from_node(api, nc, "node_agent.slots_wiped", node, wiped(ghost, node, [evidence(4)]))
    assert await api.scalar("SELECT count(*) FROM slot_wipes WHERE allocation_id=$1", uuid.UUID(ghost["id"])) == 1
    client, _ = await api.tenant_user()
    assert (await client.get(f"/v1/allocations/{ghost['id']}/wipe")).status == 404
    assert (await (await api.admin()).get(f"/v1/allocations/{ghost['id']}/wipe")).status == 404
