"""The runner (`./taskw up`) on servers it is given: no embedded NATS or PostgreSQL is started,
every service comes up as its own process against them, with its own role and schema."""
from __future__ import annotations

import asyncio
import json

import asyncpg
import psutil
import pytest

from shared.bus_identity import node_identity
from shared.contract import SERVICES
from shared.db import role_name
from tests.support.polling import eventually
from tooling.bus_permissions import IDENTITIES, NODE_IDENTITY
from tooling.client import TesseraClient
from tooling.platform import CORE_SERVICES, NODE_AGENTS_FILE, Platform


async def test_runner_uses_the_configured_nats_and_postgres_instead_of_embedded_ones(infra, tmp_path):
    p = Platform(tmp_path, nats_url=infra.nats_url, nats_creds=infra.nats.identities, database_url=infra.admin_dsn)
    p.secrets["db"] = infra.secret   # the roles' passwords the rest of the suite connects with
    try:
        await p.start()
        assert p.nats is None and p.pg is None
        assert set(p.procs) == set(CORE_SERVICES)
        assert all(proc.ready.is_set() for proc in p.procs.values())
        async with p.admin() as admin:
            assert (await admin.request("GET", "/v1/tenants"))[0] == 200
        conn = await asyncpg.connect(infra.admin_dsn)
        try:
            schemas = {r["nspname"]: r["owner"] for r in await conn.fetch(
                "SELECT nspname, pg_get_userbyid(nspowner) AS owner FROM pg_namespace")}
        finally:
            await conn.close()
        for service in SERVICES:
            assert schemas.get(service) == role_name(service)
        # each service connected with its own identity on the bus, and the server refused it nothing
        for name, proc in p.procs.items():
            assert proc.env["TESSERA_NATS_NKEY_FILE"] == infra.nkey_file(name)
            assert "nats.error" not in proc.log_path.read_text(), name
    finally:
        await p.stop()
    assert all(proc.proc.poll() is not None for proc in p.procs.values())


async def test_rotating_one_services_credential_needs_a_restart_of_that_service_only(infra, tmp_path):
    """A new seed for the scheduler (the server reloaded with its new public key), the scheduler restarted: it
    consumes and publishes again (a node registered through the gateway is confirmed), the other services kept
    their processes and their connections, and the old seed is refused."""
    import signal

    import nats

    p = Platform(tmp_path, nats_url=infra.nats_url, nats_creds=infra.nats.identities, database_url=infra.admin_dsn)
    p.secrets["db"] = infra.secret
    try:
        await p.start()
        pids = {name: proc.proc.pid for name, proc in p.procs.items()}
        old_seed = tmp_path / "old-scheduler.nk"
        old_seed.write_bytes(infra.nats.identities.seed_file("scheduler").read_bytes())
        old_seed.chmod(0o600)
        p.kill("scheduler", signal.SIGTERM)
        await asyncio.to_thread(infra.nats.identities.rotate, "scheduler")
        assert infra.nats.identities.seed_file("scheduler").read_bytes() != old_seed.read_bytes()
        await p.restart("scheduler")
        async with p.admin() as admin:
            node = await admin.register_node("rotated-1")
            await admin.wait_node_registered(node["id"])     # gateway -> scheduler -> gateway, as before
        assert {n: proc.proc.pid for n, proc in p.procs.items() if n != "scheduler"} == \
            {n: pid for n, pid in pids.items() if n != "scheduler"}
        for name, proc in p.procs.items():
            assert "nats.error" not in proc.log_path.read_text(), name
        with pytest.raises(nats.errors.Error, match="(?i)authorization violation"):
            await nats.connect(infra.nats_url, nkeys_seed=str(old_seed), allow_reconnect=False,
                               max_reconnect_attempts=0, connect_timeout=5)
    finally:
        await p.stop()


def test_a_service_with_a_bad_setting_exits_with_one_line_naming_it(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "TESSERA_HTTP_PORT": "eighty", "PYTHONPATH": "."}
    r = subprocess.run([sys.executable, "-m", "services.billing"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == "billing: cannot start: TESSERA_HTTP_PORT='eighty' is not a port number"
    assert "Traceback" not in r.stderr


def _running_in(folder) -> list[str]:
    """Processes whose command line names ``folder`` (nats-server -c <folder>/nats/…, postgres -D <folder>/pg/…)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if str(folder) in cmdline:
            found.append(f"{proc.pid} {cmdline[:120]}")
    return found


async def test_a_start_that_fails_stops_the_nats_and_postgres_and_services_it_started(tmp_path):
    # every service gets a setting it refuses, so each exits at once with one line naming it
    p = Platform(tmp_path, env={"TESSERA_HTTP_PORT": "eighty"}, durable=False)
    try:
        with pytest.raises(RuntimeError, match="exited before it was ready"):
            await p.start()
        assert p.nats is not None and p.pg is not None, "it got as far as starting its own servers"
        assert all(sp.proc is None or sp.proc.poll() is not None for sp in p.procs.values())
        assert _running_in(tmp_path) == []
    finally:
        await p.stop()   # whatever the assertions found, leave nothing behind


async def test_the_demo_seed_has_a_tenant_admin_and_a_restart_keeps_its_nodes_schedulable(tmp_path):
    """Two runs of the runner on one data folder (as `./taskw up`, stopped, then started again): the second
    run's node-agents are the same nodes, so the approved slot maps still hold and allocations are placed."""
    from tooling.cli import banner, seed

    first = Platform(tmp_path, durable=False)
    try:
        await first.start()
        data = await seed(first)
        shown = banner(first, data)
        assert data["admin_api_key"] in shown and data["api_key"] in shown
        async with TesseraClient(first.gateway_url, data["admin_api_key"]) as tenant_admin:
            made = await tenant_admin.create_user(data["tenant_id"], "alice", "tenant_user")
            users = (await tenant_admin.request("GET", f"/v1/tenants/{data['tenant_id']}/users"))[1]["items"]
            assert {made["id"], data["user_id"], data["admin_id"]} <= {u["id"] for u in users}
            quotas = (await tenant_admin.request("GET", f"/v1/tenants/{data['tenant_id']}/quotas"))[1]["items"]
            # and, with the lab's bare-metal demo node, its own pool
            expected = [("shared", "H100", 16)] + ([("baremetal", "H100", 8)] if data.get("bm_node") else [])
            assert sorted((q["pool"], q["gpu_model"], q["limit"]) for q in quotas) == sorted(expected)
        # each node-agent connected as its node, and the server refused none of them anything (not even the
        # rows of another node in the outbox they share)
        assert first.node_agents()
        for name in first.node_agents():
            node_id = name.split(":", 1)[1]
            assert first.procs[name].env["TESSERA_NATS_NKEY_FILE"].endswith(f"/{node_identity(node_id)}.nk")
            assert "nats.error" not in first.procs[name].log_path.read_text(), name
    finally:
        await first.stop()
    # the bus identities: one per service plus ops and admin, readable by their owner only, kept for the next run
    identities = tmp_path / "nats" / "identities"
    seeds = {f.name: f.read_bytes() for f in identities.glob("*.nk")}
    # (each demo node-agent its node's, made when it first started)
    fixed = {f"{i}.nk" for i in IDENTITIES}
    assert fixed <= set(seeds) and {f"{node_identity(n)}.nk" for n in data["nodes"]} <= set(seeds)
    assert all(NODE_IDENTITY.match(name[:-3]) for name in set(seeds) - fixed), seeds
    assert identities.stat().st_mode & 0o777 == 0o700
    assert {(identities / name).stat().st_mode & 0o777 for name in seeds} == {0o600}

    # a data folder from before this change: no tenant admin in seed.json, no record of one node-agent's settings
    seeded = json.loads((tmp_path / "seed.json").read_text())
    legacy = {k: v for k, v in seeded.items() if k not in ("admin_id", "admin_api_key")}
    (tmp_path / "seed.json").write_text(json.dumps(legacy))
    records = json.loads((tmp_path / NODE_AGENTS_FILE).read_text())
    del records[data["nodes"][1]]
    (tmp_path / NODE_AGENTS_FILE).write_text(json.dumps(records))

    again = Platform(tmp_path, durable=False)
    try:
        await again.start()
        assert {f.name: f.read_bytes() for f in identities.glob("*.nk")} == seeds
        data2 = await seed(again)
        assert {k: data2[k] for k in legacy} == legacy
        assert data2["admin_api_key"] and data2["admin_api_key"] != data["admin_api_key"]

        # the scheduler has handled every topology report, this run's included: every node (the two demo nodes, and
        # the lab's bare-metal node) x 2 starts
        nodes = len(data["nodes"]) + (1 if data.get("bm_node") else 0)
        db = await asyncpg.connect(again.database_url)
        try:
            unhandled = ("SELECT count(*) FILTER (WHERE i.event_id IS NULL) AS unhandled, count(*) AS reports "
                         "FROM node_agent.outbox o LEFT JOIN scheduler.inbox i ON i.event_id = o.id "
                         "WHERE o.type = 'scheduler.report_topology'")
            await eventually(lambda: db.fetchrow(unhandled), until=lambda r: r["reports"] == 2 * nodes and r["unhandled"] == 0,
                             timeout=60, what="both restarted node-agents' reports handled by the scheduler")
        finally:
            await db.close()
        async with again.admin() as admin:
            for node_id in data["nodes"]:
                node = await admin.node(node_id)
                assert node["status"] == "schedulable", node
        async with TesseraClient(again.gateway_url, data["api_key"]) as tenant:
            a = await tenant.create_allocation("after-restart", shape="vm.2gpu")
            active = await tenant.wait_state(a["id"], "ACTIVE", timeout=60)
            assert active["node_id"] in data["nodes"]
    finally:
        await again.stop()
    assert _running_in(tmp_path) == []
