"""Every `tessera` verb that changes or reads something beyond the basics of test_cli.py, run as a subprocess
against the package's live platform: its output names what it changed, and its exit code is the documented one
(0 done, 2 a bad field, 3 not found, 4 denied, 5 a conflict)."""
from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tests.e2e.test_cli import cli_env, ok, run, until

MISSING = str(uuid.uuid4())
NO_8GPU = '@reason("no 8-GPU slices here")\nforbid (principal, action, resource is Tessera::Allocation) ' \
          'when { resource.shape == "vm.8gpu" };\n'
# an Allocation's attributes as the policy schema wants them all (docs/policies.md)
ALLOCATION = ["name=a", "pool=shared", "spot=false", "privileged=false", "priority_class=normal",
              "image_approved=true"]


def _resource(shape: str, gpus: int) -> list[str]:
    return [arg for kv in [*ALLOCATION, f"shape={shape}", f"gpu_count={gpus}"] for arg in ("--resource", kv)]


async def _fails(env: dict, code: int, *args: str) -> str:
    """Run a command that must fail with ``code``: its one-line error (no traceback)."""
    rc, out, err = await run(env, *args)
    assert rc == code, (args, rc, out, err)
    assert err.startswith("error: ") and "Traceback" not in err, err
    return err


async def _doc(env: dict, *args: str) -> dict:
    return json.loads(await ok(env, *args, "-o", "json"))


async def test_budget_policy_and_key_verbs(platform, tenant, tmp_path):
    owner = cli_env(tmp_path, platform.gateway_url, tenant.admin.api_key)
    user = cli_env(tmp_path, platform.gateway_url, tenant.user.api_key)
    admin = cli_env(tmp_path, platform.gateway_url, platform.admin_key)

    assert tenant.id in await ok(owner, "budget", "set", "--amount-minor", "5000", "--threshold", "50")
    budget = await until(lambda: _budget(owner), what="the budget set")
    assert budget["currency"] == "USD" and [t["percent"] for t in budget["thresholds"]] == [50]
    assert "amount_minor" in await _fails(owner, 2, "budget", "set", "--amount-minor", "0")
    assert "deleted" in await ok(owner, "budget", "delete")
    await until(lambda: _no_budget(owner), what="the budget gone")

    cedar = tmp_path / "no-8gpu.cedar"
    cedar.write_text(NO_8GPU)
    created = await ok(owner, "policy", "create", "no-8gpu", str(cedar), "--description", "cli verbs")
    policy_id = created.split()[1]
    assert created.strip() == f"policy {policy_id} created"
    assert policy_id in (await ok(owner, "policy", "list", "-o", "name")).split()
    assert (await _doc(owner, "policy", "get", policy_id))["text"] == NO_8GPU
    rc, out, _ = await run(owner, "policy", "evaluate", "createAllocation", *_resource("vm.8gpu", 8))
    assert (rc, out.strip()) == (4, "denied: no 8-GPU slices here")
    assert (await ok(owner, "policy", "evaluate", "createAllocation", *_resource("vm.1gpu", 1))).strip() == "allowed"
    cedar.write_text("forbid (principal, action, resource) when { resource.nope };")
    await _fails(owner, 2, "policy", "create", "broken", str(cedar))
    assert f"policy {policy_id} deleted" in await ok(owner, "policy", "delete", policy_id)
    await _fails(owner, 3, "policy", "get", policy_id)

    created = await ok(user, "key", "create", "ci", "--expires-in", "3600")
    key_id, secret = created.split()[2], created.split()[-1]
    assert created.startswith(f"api key {key_id} created: ") and secret.startswith("tsk_")
    assert key_id in (await ok(user, "key", "list", "-o", "name")).split()
    assert f"api key {key_id} revoked" in await ok(user, "key", "revoke", key_id)
    keys = (await _doc(user, "key", "list"))["items"]
    assert next(k for k in keys if k["id"] == key_id)["state"] == "revoked"
    await _fails(user, 3, "key", "revoke", "0000000000000000")
    assert "--tenant" in await _fails(admin, 2, "key", "list")          # a provider admin belongs to no tenant
    listed = await ok(admin, "key", "list", "--tenant", tenant.id, "--user", tenant.user_id, "-o", "name")
    assert key_id in listed.split()


async def _budget(env: dict) -> dict | None:
    return (await _doc(env, "budget", "get"))["budget"]


async def _no_budget(env: dict) -> bool:
    return (await _doc(env, "budget", "get"))["budget"] is None


async def test_alloc_power_console_and_billing_reads(platform, admin, tenant, tmp_path):
    owner = cli_env(tmp_path, platform.gateway_url, tenant.admin.api_key)
    user = cli_env(tmp_path, platform.gateway_url, tenant.user.api_key)
    ops = cli_env(tmp_path, platform.gateway_url, platform.admin_key)
    image = f"cli-{uuid.uuid4().hex[:8]}"
    await admin.request("POST", "/v1/images", json_body={
        "name": image, "os": "Ubuntu 24.04", "format": "qcow2", "source": f"https://images.example.com/{image}.qcow2",
        "sha256": "0" * 64, "min_disk_gb": 20, "visibility": "public"}, expect=(201,))
    assert image in await ok(user, "image", "list", "-o", "wide")

    a = await tenant.user.create_allocation("cli-power", shape="vm.1gpu")
    await tenant.user.wait_state(a["id"], "ACTIVE", timeout=60)
    for action, power in (("stop", "stopped"), ("start", "running"), ("reboot", "running")):
        out = await ok(user, "alloc", action, a["id"])
        assert out.strip() == f"allocation {a['id']}: {action} requested"
        await until(lambda action=action, power=power: _power_done(tenant.user, a["id"], action, power), timeout=20,
                    what=f"{action} done on the sim")
    assert "no guest runs under the sim driver" in await ok(user, "alloc", "console", a["id"])
    await asyncio.gather(_fails(user, 3, "alloc", "reboot", MISSING), _fails(user, 3, "alloc", "console", MISSING),
                         _fails(ops, 4, "alloc", "reboot", a["id"]))    # allocations are a tenant's

    usage = await until(lambda: _items(user, "usage"), what="metered usage")
    assert [g["key"] for g in usage] == ["vm.1gpu"]
    actions = await until(lambda: _power_audited(owner), what="the three actions audited")
    assert sorted(actions) == [f"/v1/allocations/{a['id']}/actions/{x}" for x in ("reboot", "start", "stop")]
    invoices = await until(lambda: _items(owner, "invoice", "list"), what="the month's draft invoice")
    invoice = invoices[0]
    got = await _doc(owner, "invoice", "get", invoice["invoice_id"])
    assert got["status"] == "draft" and got["tenant_id"] == tenant.id
    no_display = {**owner, "DISPLAY": "", "WAYLAND_DISPLAY": "", "BROWSER": "", "TMPDIR": str(tmp_path)}
    path = Path((await ok(no_display, "invoice", "open", invoice["invoice_id"])).strip())
    assert path.parent == tmp_path and got["number"] in path.read_text()
    await _fails(user, 4, "invoice", "list")                             # invoices are the tenant admin's
    await _fails(owner, 3, "invoice", "open", MISSING)
    await tenant.user.release(a["id"])


async def _power_done(client, allocation_id: str, action: str, power: str) -> bool:
    _, page, _ = await client.request("GET", f"/v1/allocations/{allocation_id}/actions")
    newest = next((x for x in page["items"] if x["action"] == action), None)
    assert newest is None or newest["state"] in ("pending", "succeeded"), newest
    return bool(newest) and newest["state"] == "succeeded" and newest["power_state"] == power


async def _power_audited(env: dict) -> list[str] | None:
    """The paths of the successful power actions audited, once there are three (the trail is written after the
    answer; the 404 asked above is there too, as a failure)."""
    items = await _items(env, "audit", "--action", "requestPowerAction")
    paths = [e["path"] for e in items if e["outcome"] == "success"]
    return paths if len(paths) >= 3 else None


async def _items(env: dict, *args: str) -> list[dict]:
    return (await _doc(env, *args))["items"]


async def test_node_onboarding_verbs(platform, admin, tenant, tmp_path):
    ops = cli_env(tmp_path, platform.gateway_url, platform.admin_key)
    owner = cli_env(tmp_path, platform.gateway_url, tenant.admin.api_key)
    pool, name = f"cli-{uuid.uuid4().hex[:6]}", f"cli-node-{uuid.uuid4().hex[:6]}"
    assert f"pool {pool} set" in await ok(ops, "pool", "set", pool, "--policy", "spread", "--taint", "dedicated=cli")
    pools = {p["name"]: p for p in (await _doc(ops, "pool", "list"))["items"]}
    assert pools[pool]["policy"] == "spread" and pools[pool]["taints"] == {"dedicated": "cli:NoSchedule"}
    await _fails(ops, 2, "pool", "set", pool, "--policy", "scatter")

    # its own pool, so no other test's allocation lands on it
    node = await _doc(ops, "node", "register", name, "--gpu-model", "H100", "--gpu-count", "8", "--pool", pool)
    node_id = node["id"]
    await _fails(ops, 2, "node", "register", "bad name", "--gpu-model", "H100", "--gpu-count", "8")
    await _fails(owner, 4, "node", "register", name, "--gpu-model", "H100", "--gpu-count", "8")
    await admin.wait_node_registered(node_id)
    assert "no slot map to approve" in await _fails(ops, 5, "node", "approve", node_id)
    await platform.start_node_agent(node_id, {"TESSERA_NODE_NAME": name})
    await admin.wait_node(node_id, "pending_approval")
    assert f"node {node_id} approved" in await ok(ops, "node", "approve", node_id)
    await admin.wait_node(node_id, "schedulable")
    await _fails(ops, 5, "node", "approve", node_id, "--proposal", "1")  # nothing awaits approval now

    for verb, cordoned in (("cordon", True), ("uncordon", False), ("drain", True), ("undrain", False)):
        extra = ("--reason", "cli verbs") if verb == "drain" else ()
        assert f"node {node_id}: {verb} requested" in await ok(ops, "node", verb, node_id, *extra)
        await until(lambda c=cordoned: _cordoned(ops, node_id, c), what=f"{verb} applied")
    await ok(ops, "node", "cordon", node_id)                             # leave it out of every later placement
    assert name in await ok(ops, "node", "get", node_id)
    health = await _doc(ops, "node", "health", node_id)
    assert health["node_id"] == node_id and health["pool"] == pool
    assert node_id in (await ok(ops, "node", "health", "-o", "name")).split()
    await asyncio.gather(_fails(ops, 3, "node", "get", MISSING), _fails(ops, 3, "node", "cordon", MISSING))


async def _cordoned(env: dict, node_id: str, cordoned: bool) -> bool:
    return (await _doc(env, "node", "get", node_id))["cordoned"] is cordoned


async def test_price_list_and_shape_verbs(platform, tenant, tmp_path):
    ops = cli_env(tmp_path, platform.gateway_url, platform.admin_key)
    owner = cli_env(tmp_path, platform.gateway_url, tenant.admin.api_key)
    version = f"cli-{uuid.uuid4().hex[:8]}"
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"currency": "USD", "effective_from": (datetime.now(UTC) + timedelta(seconds=2))
                                  .isoformat(), "gpu_prices": [{"micros_per_gpu_hour": 4_000_000}]}))
    assert f"price list {version} published" in await ok(ops, "price-list", "publish", version, str(prices))
    await _fails(owner, 4, "price-list", "publish", f"{version}-x", str(prices))

    shape = f"cli{uuid.uuid4().hex[:6]}.2gpu"
    assert f"shape {shape} set" in await ok(ops, "shape", "set", shape, "--kind", "vm", "--gpu-count", "2",
                                            "--gpu-model", "H100")
    await until(lambda: _has(ops, ("shape", "list"), shape), what="the shape listed")
    await _fails(ops, 2, "shape", "set", shape, "--kind", "vm", "--gpu-count", "3")
    await _fails(owner, 4, "shape", "set", shape, "--kind", "vm", "--gpu-count", "2")
    assert f"shape {shape} deleting" in await ok(ops, "shape", "delete", shape)
    await until(lambda: _gone(ops, ("shape", "list"), shape), what="the shape retired")
    await _fails(ops, 3, "shape", "delete", f"cli{uuid.uuid4().hex[:6]}.none")

    await until(lambda: _in_force(ops, version), what=f"price list {version} in force")
    assert "effective since" in await _fails(ops, 5, "price-list", "publish", version, str(prices))


async def test_tenant_user_and_rate_limit_verbs(platform, tenant, tmp_path):
    ops = cli_env(tmp_path, platform.gateway_url, platform.admin_key)
    owner = cli_env(tmp_path, platform.gateway_url, tenant.admin.api_key)
    name = f"cli-{uuid.uuid4().hex[:8]}"
    created = await _doc(ops, "tenant", "create", name)
    tid = created["id"]
    assert created["name"] == name and tid in (await ok(ops, "tenant", "list", "-o", "name")).split()
    await _fails(ops, 5, "tenant", "create", name)
    await _fails(ops, 2, "tenant", "create", "bad/name")
    await _fails(owner, 4, "tenant", "list")
    out = await ok(ops, "user", "create", "alice", "--tenant", tid, "--role", "tenant_admin")
    assert out.startswith("user ") and "api key: tsk_" in out
    await _fails(ops, 2, "user", "create", "bob", "--tenant", tid, "--role", "boss")
    await _fails(ops, 3, "user", "create", "carol", "--tenant", MISSING)

    assert f"rate limits of {tid} set" in await ok(ops, "rate-limit", "set", "--tenant", tid,
                                                   "--limit", "write_per_s=2", "--limit", "read_burst=50")
    limits = await _doc(ops, "rate-limit", "get", "--tenant", tid)
    assert sorted(limits["overridden"]) == ["read_burst", "write_per_s"] and limits["effective"]["write"]["per_s"] == 2
    assert "write=2/" in await ok(ops, "rate-limit", "get", "--tenant", tid)
    await _fails(ops, 2, "rate-limit", "set", "--tenant", tid, "--limit", "write_per_s=many")
    await _fails(ops, 2, "rate-limit", "set", "--tenant", tid, "--limit", "bogus=2")
    await _fails(owner, 4, "rate-limit", "set", "--tenant", tid, "--limit", "write_per_s=2")
    assert f"rate limits of {tid} deleted" in await ok(ops, "rate-limit", "delete", "--tenant", tid)
    assert (await _doc(ops, "rate-limit", "get", "--tenant", tid))["overridden"] == []


async def _in_force(env: dict, version: str) -> bool:
    """Until a version is in force, publishing it again replaces it; after, it is a conflict."""
    return any(v["version"] == version and v["in_force"] for v in await _items(env, "price-list", "list"))


async def _has(env: dict, args: tuple[str, ...], name: str) -> bool:
    return name in (await ok(env, *args, "-o", "name")).split()


async def _gone(env: dict, args: tuple[str, ...], name: str) -> bool:
    return not await _has(env, args, name)
