"""Node health through the gateway: a node's health document and history, the fleet view, the health policy, the
pools' breakers, drain and undrain, injected faults (the scheduler and the node-agent are played by publishing
their events; the commands the routes send are watched on the bus)."""
from __future__ import annotations

import uuid

from tests.support.gateway import assert_problem, node_doc, outbox_count, project, project_from_node

AT = "2030-01-01T00:00:00Z"


async def a_node(api, nc) -> tuple[str, str]:
    node_id, name = str(uuid.uuid4()), f"node-{uuid.uuid4().hex[:8]}"
    await project(api, nc, "scheduler.node_changed", node_doc(node_id, name, 1, status="schedulable", proposal=None))
    return node_id, name


def health_doc(node_id: str, version: int, state: str = "healthy", event: str = "heartbeat", **over) -> dict:
    doc = {"node_id": node_id, "pool": "shared", "state": state, "since": AT, "last_seen": AT, "alerts": [],
           "cordoned_by": None, "draining": False, "drain_deadline": None, "breaker_open": False, "event": event,
           "version": version}
    doc.update(over)
    return doc


XID_79 = {"source": "sim", "target": "gpu:3", "condition": "xid:79", "since": AT, "message": "GPU fell off the bus",
          "tenant_message": "a GPU of your allocation failed", "classifications": ["prevent_allocations", "drain"]}


async def test_a_nodes_health_shows_the_newest_document_and_every_change_newest_first(api, nc):
    admin = await api.admin()
    node_id, name = await a_node(api, nc)
    doc = (await admin.get(f"/v1/nodes/{node_id}/health")).body
    assert (doc["state"], doc["version"], doc["history"], doc["name"]) == ("unknown", 0, [], name)
    await project(api, nc, "scheduler.node_health_changed",
                  health_doc(node_id, 2, "suspect", "xid:79 on gpu:3: cordoned", alerts=[XID_79], cordoned_by="xid:79",
                             draining=True, drain_deadline="2030-01-02T00:00:00Z"))
    await project(api, nc, "scheduler.node_health_changed", health_doc(node_id, 1, "healthy", "first heartbeat"))
    doc = (await admin.get(f"/v1/nodes/{node_id}/health")).body
    assert (doc["state"], doc["version"], doc["cordoned_by"], doc["draining"]) == ("suspect", 2, "xid:79", True)
    assert doc["alerts"][0]["condition"] == "xid:79"
    assert doc["alerts"][0]["classifications"] == ["prevent_allocations", "drain"]
    assert [(h["version"], h["event"], h["alerts"]) for h in doc["history"]] == [
        (2, "xid:79 on gpu:3: cordoned", 1), (1, "first heartbeat", 0)]
    assert (await admin.get(f"/v1/nodes/{uuid.uuid4()}/health")).status == 404


async def test_the_fleet_view_lists_every_nodes_state_and_filters_by_state(api, nc):
    admin = await api.admin()
    sick, sick_name = await a_node(api, nc)
    quiet, _ = await a_node(api, nc)
    await project(api, nc, "scheduler.node_health_changed", health_doc(sick, 1, "suspect", alerts=[XID_79]))
    items = {i["node_id"]: i for i in (await admin.get("/v1/health/nodes")).body["items"]}
    assert (items[sick]["state"], items[sick]["alerts"], items[sick]["name"]) == ("suspect", 1, sick_name)
    assert (items[quiet]["state"], items[quiet]["alerts"]) == ("unknown", 0)
    suspect = {i["node_id"] for i in (await admin.get("/v1/health/nodes?state=suspect")).body["items"]}
    assert sick in suspect and quiet not in suspect
    assert_problem(await admin.get("/v1/health/nodes?state=on_fire"), 422, "state")


async def test_the_policy_shows_each_condition_and_a_change_is_sent_to_the_scheduler(api, nc, watch):
    admin = await api.admin()
    commands = await watch("scheduler.cmd.set_health_policy")
    condition = f"xid:{uuid.uuid4().int % 900 + 100}"
    await project(api, nc, "scheduler.health_policy_changed",
                  {"condition": condition, "classifications": ["prevent_allocations"], "note": "seeded", "version": 1})
    rows = {r["condition"]: r for r in (await admin.get("/v1/health/policy")).body["items"]}
    assert rows[condition]["classifications"] == ["prevent_allocations"] and rows[condition]["version"] == 1
    r = await admin.call("PUT", f"/v1/health/policy/{condition}",
                         json_body={"classifications": ["drain", "fence", "drain"], "note": "moves its tenants"})
    assert r.status == 202 and r.body["classifications"] == ["drain", "fence"], r.body
    hits = await commands.wait_for(lambda i: i[1]["data"]["condition"] == condition)
    assert hits[0][1]["data"]["classifications"] == ["drain", "fence"]
    assert hits[0][1]["data"]["requested_by"] is not None
    for path, body, field in ((f"/v1/health/policy/{condition}", {"classifications": ["explode"]}, "classifications.0"),
                              (f"/v1/health/policy/{condition}", {"note": "no classifications"}, "classifications"),
                              ("/v1/health/policy/XID-79", {"classifications": []}, "condition")):
        assert_problem(await admin.call("PUT", path, json_body=body), 422, field)


async def test_drain_sends_the_scheduler_the_mode_and_deadline_and_undrain_uncordons(api, nc, watch):
    admin = await api.admin()
    drains, updates = await watch("scheduler.cmd.drain_node"), await watch("scheduler.cmd.update_node")
    node_id, _ = await a_node(api, nc)
    r = await admin.post(f"/v1/nodes/{node_id}/drain", {"mode": "deadline", "deadline": "2030-01-01T06:00:00Z",
                                                         "reason": "PSU swap"})
    assert r.status == 202 and r.body["mode"] == "deadline", r.body
    hits = await drains.wait_for(lambda i: i[1]["data"]["node_id"] == node_id)
    sent = hits[0][1]["data"]
    assert (sent["mode"], sent["reason"]) == ("deadline", "PSU swap") and sent["deadline"].startswith("2030-01-01T06")
    assert (await admin.post(f"/v1/nodes/{node_id}/drain", {})).status == 202   # now, with the default reason
    r = await admin.post(f"/v1/nodes/{node_id}/undrain")
    assert r.status == 202 and r.body["cordoned"] is False
    await updates.wait_for(lambda i: i[1]["data"]["node_id"] == node_id and i[1]["data"]["cordoned"] is False)
    for bad in ({"mode": "deadline"}, {"mode": "now", "deadline": "2030-01-01T06:00:00Z"}, {"mode": "later"},
                {"mode": "deadline", "deadline": "tomorrow"}, {"node_id": node_id}):
        assert_problem(await admin.post(f"/v1/nodes/{node_id}/drain", bad), 422)
    assert (await admin.post(f"/v1/nodes/{uuid.uuid4()}/drain", {})).status == 404
    assert (await admin.post(f"/v1/nodes/{uuid.uuid4()}/undrain")).status == 404
    assert await outbox_count(api, "scheduler.drain_node", "node_id", node_id) == 2


async def test_breakers_are_listed_and_closing_one_is_sent_to_the_scheduler(api, nc, watch):
    admin = await api.admin()
    commands = await watch("scheduler.cmd.close_breaker")
    pool = f"pool-{uuid.uuid4().hex[:8]}"
    await project(api, nc, "scheduler.breaker_changed", {"pool": pool, "open": True, "opened_at": AT,
                                                         "cordons_in_window": 3, "share": 0.2, "window_s": 600.0,
                                                         "version": 1})
    rows = {b["pool"]: b for b in (await admin.get("/v1/health/breakers")).body["items"]}
    assert rows[pool]["open"] is True and rows[pool]["cordons_in_window"] == 3
    r = await admin.post(f"/v1/health/breakers/{pool}/close")
    assert r.status == 202 and r.body["pool"] == pool
    await commands.wait_for(lambda i: i[1]["data"]["pool"] == pool)
    assert (await admin.post("/v1/health/breakers/no-such-pool/close")).status == 404
    assert_problem(await admin.post("/v1/health/breakers/Not_A_Pool/close"), 422, "pool")


async def test_an_injected_fault_is_sent_on_the_nodes_subject_and_shows_the_nodes_answer(api, nc, watch):
    admin = await api.admin()
    node_id, _ = await a_node(api, nc)
    commands = await watch(f"node_agent.cmd.inject_fault.{node_id}")
    r = await admin.post(f"/v1/nodes/{node_id}/faults", {"kind": "xid", "code": 79, "gpu": 3})
    assert r.status == 202 and r.body["accepted"] is None, r.body
    request_id = r.body["request_id"]
    hits = await commands.wait_for(lambda i: i[1]["data"]["request_id"] == request_id)
    assert (hits[0][1]["data"]["kind"], hits[0][1]["data"]["code"], hits[0][1]["data"]["gpu"]) == ("xid", 79, 3)
    await project_from_node(api, nc, "node_agent.fault_injected", node_id,
                            {"node_id": node_id, "request_id": request_id, "kind": "xid", "accepted": False,
                             "reason": "this node's driver does not simulate hardware"})
    fault = (await admin.get(f"/v1/nodes/{node_id}/faults/{request_id}")).body
    assert fault["accepted"] is False and "simulate" in fault["reason"]
    assert (await admin.get(f"/v1/nodes/{node_id}/faults/{uuid.uuid4()}")).status == 404
    for bad in ({"kind": "xid"}, {"kind": "ecc_dbe", "code": 48}, {"kind": "meteor"}, {"kind": "xid", "code": 0},
                {"kind": "temperature", "gpu": 64}, {"kind": "heartbeat_loss", "duration_s": 0}):
        assert_problem(await admin.post(f"/v1/nodes/{node_id}/faults", bad), 422)
    assert (await admin.post(f"/v1/nodes/{uuid.uuid4()}/faults", {"kind": "clear"})).status == 404


async def test_health_routes_are_for_provider_admins_only(api, nc):
    user, _ = await api.tenant_user("tenant_admin")
    node_id, _ = await a_node(api, nc)
    for method, path, body in (("GET", f"/v1/nodes/{node_id}/health", None), ("GET", "/v1/health/nodes", None),
                               ("GET", "/v1/health/policy", None), ("GET", "/v1/health/breakers", None),
                               ("PUT", "/v1/health/policy/xid:79", {"classifications": []}),
                               ("POST", f"/v1/nodes/{node_id}/drain", {}), ("POST", f"/v1/nodes/{node_id}/undrain", None),
                               ("POST", "/v1/health/breakers/shared/close", None),
                               ("POST", f"/v1/nodes/{node_id}/faults", {"kind": "clear"}),
                               ("GET", f"/v1/nodes/{node_id}/faults/{uuid.uuid4()}", None)):
        assert_problem(await user.call(method, path, json_body=body), 403)
    assert (await api.anonymous().get("/v1/health/nodes")).status == 401
    for type_ in ("scheduler.drain_node", "node_agent.inject_fault"):
        assert await outbox_count(api, type_, "node_id", node_id) == 0

