"""`kill -9` of each service in turn, and of a node-agent, while a tenant creates and releases allocations:
the runner starts the process again (its /readyz answers), and every allocation that was in flight ends where
its tenant wanted it, ACTIVE or RELEASED, none left half-way.

One platform for the module (a start costs more than a kill): each test kills one process of it, and that process
is back, and the platform whole again, before the test ends. A tenant's calls that meet a dead gateway or a
dead service (a refused connection, a 502/503/504) are retried, a creation with the same idempotency key."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import uuid

import aiohttp
import pytest

from tests.support.platform import E2E_ENV
from tests.support.polling import eventually
from tooling.client import ApiError, TesseraClient
from tooling.platform import Platform
from tooling.supervision import RestartPolicy

# A killed consumer's unacknowledged message comes again after the ack wait; the saga's steps wait long enough for
# a restart and that redelivery (a step that times out would fail the allocation: a different test's subject).
RESTART_ENV = {**E2E_ENV, "TESSERA_ACK_WAIT_S": "2", "TESSERA_SAGA_STEP_TIMEOUT_S": "30",
               "TESSERA_SAGA_STEP_TIMEOUTS": "provision_node=30"}
NODE_ENV = {"TESSERA_SIM_LATENCY_S": "0.3"}   # each node operation takes a moment: the sagas are surely in flight
SERVICES = ("gateway", "allocation", "saga", "scheduler", "network", "storage", "billing", "node-agent")
CREATED, RELEASED = 4, 2   # per kill: allocations created while it happens, and ACTIVE ones released meanwhile
TRANSIENT = (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError)


@pytest.fixture(scope="module")
async def platform(tmp_path_factory):
    p = Platform(tmp_path_factory.mktemp("restarts"), env=RESTART_ENV, durable=False, supervise=True,
                 restart_policy=RestartPolicy(initial_s=0.5, cap_s=30, stable_s=10, poll_s=0.05))
    await p.start()
    try:
        p.node_id = await p.add_node(f"restarts-{uuid.uuid4().hex[:8]}", "H100", 8, env=NODE_ENV)
        async with p.admin() as admin:
            t = await admin.create_tenant(f"restarts-{uuid.uuid4().hex[:6]}")
            await admin.set_quota(t["id"], "shared", "H100", 64)
            p.tenant_key = (await admin.create_user(t["id"], "u", "tenant_user"))["api_key"]
        yield p
    finally:
        await p.stop()


async def answered(call) -> tuple | None:
    """``(answer,)`` of ``call()``, or None when a dead gateway, or a 502/503/504 of a dead service behind it, kept
    it from answering."""
    try:
        return (await call(),)
    except TRANSIENT:
        return None
    except ApiError as exc:
        if exc.status in (502, 503, 504):
            return None
        raise


async def retried(call, what: str, timeout: float = 60.0):
    """``call()`` until it gets an answer (each retry the same request: a creation carries its idempotency key)."""
    return (await eventually(lambda: answered(call), timeout=timeout, interval=0.1, what=what))[0]


async def create(tenant: TesseraClient, name: str) -> str:
    key = str(uuid.uuid4())
    a = await retried(lambda: tenant.create_allocation(name, shape="vm.1gpu", volume_gb=5, idempotency_key=key),
                      f"create {name}")
    return a["id"]


async def release(tenant: TesseraClient, allocation_id: str) -> None:
    try:
        await retried(lambda: tenant.release(allocation_id), f"release {allocation_id}")
    except ApiError as exc:   # a retry after the first call was accepted finds it releasing already
        if exc.status != 409:
            raise


async def settled(tenant: TesseraClient, allocation_id: str, state: str) -> dict:
    """The allocation once it is ``state``; fails at once on FAILED, and names the state it is stuck in."""
    got = await eventually(lambda: answered(lambda: tenant.allocation(allocation_id)),
                           until=lambda a: a is not None and a[0]["state"] == state,
                           fail_if=lambda a: a is not None and a[0]["state"] in {"FAILED", "RELEASED"} - {state},
                           timeout=90, interval=0.1, what=f"allocation {allocation_id} {state}")
    return got[0]


def process_name(p: Platform, service: str) -> str:
    return f"node_agent:{p.node_id}" if service == "node-agent" else service


async def back_and_ready(p: Platform, name: str, killed_pid: int) -> None:
    """Wait until the supervisor has started ``name`` again and its /readyz says 200."""
    proc = p.procs[name]

    async def ready() -> bool:
        if proc.proc.pid == killed_pid or not proc.ready.is_set() or proc.port is None:
            return False
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as s, \
                    s.get(f"http://127.0.0.1:{proc.port}/readyz") as r:
                return r.status == 200
        except TRANSIENT:
            return False
    await eventually(ready, timeout=60, interval=0.1, what=f"{name} started again and ready")


def runner_records(p: Platform, name: str) -> list[dict]:
    lines = (p.workdir / "logs" / "runner.log").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["process"] == name]


@pytest.mark.parametrize("service", SERVICES)
async def test_a_service_killed_under_load_comes_back_and_its_allocations_complete(platform, service):
    p, name = platform, process_name(platform, service)
    async with TesseraClient(p.gateway_url, p.tenant_key) as tenant:
        to_release = await asyncio.gather(*(create(tenant, f"{service}-old-{i}") for i in range(RELEASED)))
        await asyncio.gather(*(settled(tenant, a, "ACTIVE") for a in to_release))

        # the load: allocations being created, others released, while the process dies
        creating = [asyncio.create_task(create(tenant, f"{service}-new-{i}")) for i in range(CREATED)]
        releasing = [asyncio.create_task(release(tenant, a)) for a in to_release]
        await eventually(lambda: any(t.done() for t in creating), timeout=30, what="a first creation accepted")
        killed = p.procs[name].proc.pid
        os.kill(killed, signal.SIGKILL)   # as `kill -9` from outside: the platform did not ask for it

        await back_and_ready(p, name, killed)
        created = await asyncio.gather(*creating)
        await asyncio.gather(*releasing)
        ended = await asyncio.gather(*(settled(tenant, a, "ACTIVE") for a in created),
                                     *(settled(tenant, a, "RELEASED") for a in to_release))
        assert [a["state"] for a in ended] == ["ACTIVE"] * CREATED + ["RELEASED"] * RELEASED

        # the runner said why it restarted the process, and when
        exited = [r for r in runner_records(p, name) if r["event"] == "process.exited" and r["pid"] == killed]
        assert len(exited) == 1 and exited[0]["signal"] == "SIGKILL" and exited[0]["next_delay_s"] == 0.5, exited

        # the platform whole again for the next kill: what this test made is released
        await asyncio.gather(*(release(tenant, a) for a in created))
        await asyncio.gather(*(settled(tenant, a, "RELEASED") for a in created))
