"""Shared fixtures and a small HTTP client for the gateway's integration tests (no tests here).

The gateway runs in-process through its real bootstrap (``run_service``) against the
suite's NATS and PostgreSQL; tests talk HTTP to it on ``rt.port``.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from functools import partial

import aiohttp
import pytest

from services.gateway.bootstrap import build
from services.gateway.state import GatewayConfig

TOKEN_SECRET = "integration-test-secret-" + "s" * 40
ADMIN_KEY = f"tsk_bootstrap_{uuid.uuid4().hex}"


@dataclass
class Reply:
    status: int
    headers: dict
    body: object

    @property
    def content_type(self) -> str:
        return self.headers.get("Content-Type", "").split(";")[0]


class Client:
    """One caller of the API: a bearer token (or none) over a shared session."""

    def __init__(self, http: aiohttp.ClientSession, token: str | None = None):
        self.http, self.token = http, token

    def _headers(self, extra: dict | None) -> dict:
        h = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        h.update(extra or {})
        return h

    async def call(self, method: str, path: str, *, json_body=None, data=None, headers: dict | None = None) -> Reply:
        async with self.http.request(method, path, json=json_body, data=data, headers=self._headers(headers)) as r:
            raw = await r.read()
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode(errors="replace")
            return Reply(r.status, dict(r.headers), body)

    async def get(self, path: str, **kw) -> Reply:
        return await self.call("GET", path, **kw)

    async def post(self, path: str, body=None, **kw) -> Reply:
        return await self.call("POST", path, json_body=body, **kw)

    async def delete(self, path: str, **kw) -> Reply:
        return await self.call("DELETE", path, **kw)


@dataclass
class Api:
    rt: object
    http: aiohttp.ClientSession

    def anonymous(self) -> Client:
        return Client(self.http)

    async def login(self, api_key: str) -> Client:
        async with self.http.post("/v1/auth/token", headers={"Authorization": f"ApiKey {api_key}"}) as r:
            assert r.status == 200, await r.text()
            return Client(self.http, (await r.json())["access_token"])

    async def admin(self) -> Client:
        return await self.login(ADMIN_KEY)

    async def new_tenant(self) -> str:
        r = await (await self.admin()).post("/v1/tenants", {"name": f"tenant-{uuid.uuid4().hex[:12]}"})
        assert r.status == 201, r.body
        return r.body["id"]

    async def new_user(self, tenant_id: str, role: str = "tenant_user") -> tuple[Client, dict]:
        r = await (await self.admin()).post(f"/v1/tenants/{tenant_id}/users",
                                            {"name": f"user-{uuid.uuid4().hex[:8]}", "role": role})
        assert r.status == 201, r.body
        return await self.login(r.body["api_key"]), r.body

    async def tenant_user(self, role: str = "tenant_user") -> tuple[Client, str]:
        tenant_id = await self.new_tenant()
        client, _ = await self.new_user(tenant_id, role)
        return client, tenant_id

    async def scalar(self, sql: str, *args):
        async with self.rt.pool.acquire() as conn:
            return await conn.fetchval(sql, *args)

    async def commands_of(self, type_: str, tenant_id: str) -> int:
        """How many ``type_`` commands the gateway queued for the tenant (every command goes through the outbox)."""
        return await self.scalar("SELECT count(*) FROM outbox WHERE type=$1 "
                                 "AND convert_from(body, 'UTF8')::jsonb->>'tenant_id' = $2", type_, tenant_id)


def gateway_config(**overrides) -> GatewayConfig:
    values = dict(token_secret=TOKEN_SECRET, bootstrap_admin_key=ADMIN_KEY, stream_poll_s=30.0)
    values.update(overrides)
    return GatewayConfig(**values)


@pytest.fixture
async def start_gateway(run_service):
    """start_gateway(**config_overrides) -> Api on a freshly started gateway (stopped after the test)."""
    sessions = []

    async def _start(**overrides) -> Api:
        rt = await run_service("gateway", partial(build, config=gateway_config(**overrides)))
        http = aiohttp.ClientSession(base_url=f"http://127.0.0.1:{rt.port}")
        sessions.append(http)
        return Api(rt, http)

    yield _start
    for http in sessions:
        await http.close()


@pytest.fixture
async def api(start_gateway) -> Api:
    return await start_gateway()


async def eventually(probe, timeout: float = 15.0, interval: float = 0.05):
    """Poll ``probe()`` (async) until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last value {value!r})")
        await asyncio.sleep(interval)


class SseReader:
    """Reads server-sent events from an open aiohttp response."""

    def __init__(self, resp: aiohttp.ClientResponse):
        self.resp = resp

    async def next_event(self, timeout: float = 10.0) -> dict:
        async def _read() -> dict:
            event: dict = {}
            while True:
                line = (await self.resp.content.readline()).decode()
                if line == "":
                    raise EOFError("stream closed")
                line = line.rstrip("\n")
                if line == "":
                    if event:
                        return event
                    continue
                if line.startswith(":"):
                    continue
                name, _, value = line.partition(": ")
                event[name] = value
        return await asyncio.wait_for(_read(), timeout)
