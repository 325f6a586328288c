"""Talking to an in-process gateway over HTTP, as its integration tests do, and playing the services whose
events it projects. The fixtures that start it (``gateway``, ``api``) are in tests/integration/conftest.py."""
from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass

import aiohttp

from services.gateway.settings import GatewaySettings
from shared.secrets import new_key
from tests.support.bus import publish_event, publish_from_node
from tests.support.polling import eventually

TOKEN_SECRET = "integration-test-secret-" + "s" * 40
ADMIN_KEY = f"tsk_bootstrap_{uuid.uuid4().hex}"
PROJECTED_WITHIN_S = 15.0          # how long a test waits for the gateway to show what it was told
SECRET_KEY = new_key()             # the platform's key (TESSERA_SECRET_KEY) the suite's gateways seal BMC passwords with


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
    """A started gateway (its runtime) and an HTTP session to it."""
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

    async def handled(self, env) -> bool:
        """The gateway's consumer processed the event (the inbox row is written with its effect)."""
        return bool(await self.scalar("SELECT 1 FROM inbox WHERE event_id=$1", env.id))


def gateway_config(**overrides) -> GatewaySettings:
    values = dict(token_secret=TOKEN_SECRET, bootstrap_admin_key=ADMIN_KEY, stream_poll_s=30.0, secret_key=SECRET_KEY)
    values.update(overrides)
    return GatewaySettings(**values)


async def publish(nc, type_: str, data: dict, tenant_id: str | None = None):
    """Play the event's owner (the scheduler, the allocation service…): publish it on its contract subject;
    returns the envelope."""
    return await publish_event(nc.jetstream(), type_, data, tenant_id=tenant_id)


async def project(api: Api, nc, type_: str, data: dict, tenant_id: str | None = None):
    """Play the event's owner: publish it, then wait until the gateway has handled it; returns the envelope."""
    env = await publish(nc, type_, data, tenant_id)
    await eventually(lambda: api.handled(env), timeout=PROJECTED_WITHIN_S, what=f"the gateway to handle {type_} {env.id}")
    return env


async def project_from_node(api: Api, nc, type_: str, node_id, data: dict, tenant_id: str | None = None):
    """``publish_from_node``, then wait until the gateway has handled it; returns the envelope."""
    env = await publish_from_node(nc, type_, node_id, data, tenant_id)
    await eventually(lambda: api.handled(env), timeout=PROJECTED_WITHIN_S, what=f"the gateway to handle {type_} {env.id}")
    return env


def assert_problem(r, status: int, field: str | None = None) -> dict:
    """The response is a problem+json of ``status`` (naming ``field`` among its errors, when given); its body."""
    assert r.status == status, (r.status, r.body)
    assert r.content_type == "application/problem+json", r.headers
    if field is not None:
        assert field in [e["field"] for e in r.body["errors"]], r.body
    return r.body


async def outbox_count(api: Api, type_: str, key: str, value: str) -> int:
    """How many ``type_`` messages whose data[key] is ``value`` the gateway queued."""
    return await api.scalar("SELECT count(*) FROM outbox WHERE type=$1 "
                            "AND convert_from(body, 'UTF8')::jsonb->'data'->>$2 = $3", type_, key, value)


# --- the scheduler, as the gateway's inventory sees it ------------------------------------------------

SLOT_MAP = {"slots": [{"index": i, "gpu_pci": f"0000:{i:02x}:00.0", "numa": i // 4, "wipe_policy": "nvme-format"}
                      for i in range(8)]}
DEFAULT_SHAPES = {"vm.1gpu": ("vm", 1), "vm.2gpu": ("vm", 2), "vm.4gpu": ("vm", 4), "vm.8gpu": ("vm", 8),
                  "bm.8gpu": ("bare_metal", 8)}


def node_doc(node_id: str, name: str, version: int, **over) -> dict:
    """A scheduler.node_changed document (pending approval of proposal 1 unless overridden)."""
    doc = {"node_id": node_id, "name": name, "status": "pending_approval", "pool": "shared", "region": "eu-1",
           "site": "fra-1", "rack": "r12", "gpu_model": "H100", "gpu_count": 8, "labels": {"hw": "hgx"}, "taints": {},
           "cordoned": False, "proposal": 1, "proposed_slot_map": SLOT_MAP, "approved_slot_map": None, "review": [],
           "free_slots": 0, "version": version}
    doc.update(over)
    return doc


async def ensure_default_shapes(api: Api, nc) -> None:
    """The scheduler's seeded shapes are in the catalog, so publishing other shapes never hides the defaults
    from the rest of the session (a stale version is simply ignored)."""
    for name, (kind, count) in DEFAULT_SHAPES.items():
        await project(api, nc, "scheduler.shape_changed", {"name": name, "kind": kind, "gpu_count": count, "version": 1})


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
