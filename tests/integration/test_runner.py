"""The runner (`./taskw up`) on servers it is given: no embedded NATS or PostgreSQL is started,
every service comes up as its own process against them, with its own role and schema."""
from __future__ import annotations

import asyncpg

from shared.contract import SERVICES
from shared.db import role_name
from tooling.platform import CORE_SERVICES, Platform


async def test_runner_uses_the_configured_nats_and_postgres_instead_of_embedded_ones(infra, tmp_path):
    p = Platform(tmp_path, nats_url=infra.nats_url, database_url=infra.admin_dsn)
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
    finally:
        await p.stop()
    assert all(proc.proc.poll() is not None for proc in p.procs.values())


def test_a_service_with_a_bad_setting_exits_with_one_line_naming_it(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "TESSERA_HTTP_PORT": "eighty", "PYTHONPATH": "."}
    r = subprocess.run([sys.executable, "-m", "services.billing"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == "billing: cannot start: TESSERA_HTTP_PORT='eighty' is not a port number"
    assert "Traceback" not in r.stderr
