"""A small async client for the gateway's HTTP API, used by the runner's seed, the demo, the
benchmark and the end-to-end tests (so they all speak to Tessera the way a tenant would)."""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp


class ApiError(Exception):
    def __init__(self, status: int, problem: Any):
        super().__init__(f"HTTP {status}: {problem}")
        self.status, self.problem = status, problem


class WaitAborted(Exception):
    """A wait stopped before its timeout: what it waits for can no longer happen (``reason`` says why;
    ``last`` is the last value seen, e.g. the FAILED allocation with its failed step and reason)."""

    def __init__(self, what: str, reason: str, last: Any = None):
        super().__init__(f"stopped waiting for {what}: {reason}")
        self.what, self.reason, self.last = what, reason, last


class NotYet(Exception):
    """Raised by a probe of ``_until``: not there yet; ``value`` is what it saw (for ``hopeless`` and the
    timeout's message)."""

    def __init__(self, value: Any):
        super().__init__(value)
        self.value = value


async def _until(probe, timeout: float, what: str, *, hopeless=None):
    """Poll ``probe`` (async; returns the result, or None while not yet) until it answers; TimeoutError
    naming ``what`` and the last value seen after ``timeout`` seconds. ``hopeless(value)`` (value: what the
    probe last returned, or the exception ``NotYet`` carried) returns a reason when the wait can no longer
    succeed: then WaitAborted with that reason, at once, instead of running to the timeout."""
    deadline = time.monotonic() + timeout
    delay, last = 0.02, None
    while True:
        try:
            found = await probe()
        except NotYet as not_yet:
            found, last = None, not_yet.value
        else:
            last = found if found is not None else last
        if found is not None:
            return found
        reason = hopeless(last) if hopeless is not None and last is not None else None
        if reason:
            raise WaitAborted(what, reason, last)
        if time.monotonic() > deadline:
            raise TimeoutError(f"not {what} after {timeout}s" + (f"; last seen: {last}" if last is not None else ""))
        await asyncio.sleep(delay)
        delay = min(delay * 1.5, 0.25)


# Where the gateway's view of an allocation can still go from each state: forward only (a QUEUED allocation
# is PROVISIONING again once placed; ACTIVE may come without PROVISIONING), FAILED from any state that is not
# terminal, nothing from RELEASED or FAILED. A state not listed here (a newer gateway's) is never given up on.
REACHABLE: dict[str, frozenset[str]] = {
    "REQUESTED": frozenset({"PROVISIONING", "QUEUED", "ACTIVE", "RELEASING", "RELEASED", "FAILED"}),
    "PROVISIONING": frozenset({"PROVISIONING", "QUEUED", "ACTIVE", "RELEASING", "RELEASED", "FAILED"}),
    "QUEUED": frozenset({"PROVISIONING", "ACTIVE", "RELEASING", "RELEASED", "FAILED"}),
    "ACTIVE": frozenset({"RELEASING", "RELEASED", "FAILED"}),
    "RELEASING": frozenset({"RELEASED", "FAILED"}),
    "RELEASED": frozenset(),
    "FAILED": frozenset(),
}


def unreachable(allocation: dict, wanted: set[str]) -> str | None:
    """Why ``allocation`` (the gateway's document) can no longer reach any of ``wanted``; None while it can."""
    state = allocation.get("state")
    if state in wanted or state not in REACHABLE or REACHABLE[state] & wanted:
        return None
    if state == "FAILED":
        return (f"allocation {allocation.get('id')} FAILED at {allocation.get('failed_step') or 'an unknown step'}: "
                f"{allocation.get('reason') or 'no reason given'}")
    return f"allocation {allocation.get('id')} is {state}, from which {' or '.join(sorted(wanted))} cannot follow"


class TesseraClient:
    def __init__(self, base_url: str, api_key: str, session: aiohttp.ClientSession | None = None):
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self._session = session
        self._own_session = session is None
        self._token: str | None = None
        self._token_expiry = 0.0

    async def __aenter__(self) -> TesseraClient:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
        return self

    async def __aexit__(self, *exc) -> None:
        if self._own_session and self._session:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "use 'async with TesseraClient(...)'"
        return self._session

    async def token(self) -> str:
        if self._token is None or time.monotonic() > self._token_expiry:
            async with self.session.post(f"{self.base_url}/v1/auth/token",
                                         headers={"Authorization": f"ApiKey {self.api_key}"}) as r:
                body = await r.json(content_type=None)
                if r.status != 200:
                    raise ApiError(r.status, body)
            self._token = body["access_token"]
            self._token_expiry = time.monotonic() + max(body.get("expires_in", 60) - 30, 5)
        return self._token

    async def request(self, method: str, path: str, *, json_body: Any = None, headers: dict | None = None,
                      expect: tuple[int, ...] = (200, 201, 202)) -> tuple[int, Any, dict]:
        h = {"Authorization": f"Bearer {await self.token()}", **(headers or {})}
        async with self.session.request(method, self.base_url + path, json=json_body, headers=h) as r:
            text = await r.text()
            body = json.loads(text) if text else None
            if r.status not in expect:
                raise ApiError(r.status, body)
            return r.status, body, dict(r.headers)

    async def text(self, path: str) -> tuple[str, dict]:
        """A non-JSON read (CSV, HTML): its text and headers; ApiError unless 200."""
        async with self.session.get(self.base_url + path, headers={"Authorization": f"Bearer {await self.token()}"}) as r:
            text = await r.text()
            if r.status != 200:
                raise ApiError(r.status, json.loads(text) if text else None)
            return text, dict(r.headers)

    # -- billing
    async def publish_price_list(self, version: str, body: dict) -> dict:
        return (await self.request("PUT", f"/v1/price-lists/{version}", json_body=body, expect=(202,)))[1]

    async def price_lists(self) -> dict:
        return (await self.request("GET", "/v1/price-lists"))[1]

    async def usage(self, query: str = "") -> dict:
        return (await self.request("GET", f"/v1/usage{'?' + query if query else ''}"))[1]

    async def invoices(self, query: str = "") -> dict:
        return (await self.request("GET", f"/v1/invoices{'?' + query if query else ''}"))[1]

    async def invoice(self, invoice_id: str) -> dict:
        return (await self.request("GET", f"/v1/invoices/{invoice_id}"))[1]

    async def ledger_verify(self) -> dict:
        return (await self.request("GET", "/v1/ops/ledger/verify"))[1]

    # -- provider admin
    async def create_tenant(self, name: str) -> dict:
        return (await self.request("POST", "/v1/tenants", json_body={"name": name}))[1]

    async def create_user(self, tenant_id: str, name: str, role: str = "tenant_user") -> dict:
        return (await self.request("POST", f"/v1/tenants/{tenant_id}/users", json_body={"name": name, "role": role}))[1]

    async def register_node(self, name: str, gpu_model: str = "H100", gpu_count: int = 8, labels: dict | None = None,
                            pool: str | None = None) -> dict:
        body = {"name": name, "gpu_model": gpu_model, "gpu_count": gpu_count, "labels": labels or {},
                **({"pool": pool} if pool else {})}
        return (await self.request("POST", "/v1/nodes", json_body=body))[1]

    async def nodes(self) -> list[dict]:
        return (await self.request("GET", "/v1/nodes"))[1]["items"]

    async def wait_node_registered(self, node_id: str, timeout: float = 30.0) -> dict:
        async def registered():
            return next((n for n in await self.nodes() if n["id"] == node_id and n.get("status") == "registered"), None)
        return await _until(registered, timeout, f"node {node_id} registered")

    async def node(self, node_id: str) -> dict:
        return (await self.request("GET", f"/v1/nodes/{node_id}"))[1]

    async def wait_node(self, node_id: str, status: str, timeout: float = 30.0) -> dict:
        """Poll GET /v1/nodes/{id} until the node has ``status`` (e.g. pending_approval, schedulable)."""
        async def in_status():
            try:
                n = await self.node(node_id)
            except ApiError as exc:
                if exc.status != 404:
                    raise
                return None
            if n.get("status") != status:
                raise NotYet({k: n.get(k) for k in ("status", "proposal", "review")})   # the timeout says where it is
            return n
        return await _until(in_status, timeout, f"node {node_id} {status}")

    async def approve_node(self, node_id: str, proposal: int, wipe_policy: str | None = None) -> dict:
        body = {"proposal": proposal, **({"wipe_policy": wipe_policy} if wipe_policy is not None else {})}
        return (await self.request("POST", f"/v1/nodes/{node_id}/approve", json_body=body))[1]

    async def onboard_node(self, node_id: str, timeout: float = 90.0, wipe_policy: str | None = None) -> dict:
        """Wait for the node-agent's discovery, approve the proposed slot map (with ``wipe_policy`` for every slot,
        when given), wait until schedulable (its burn-in passed). Each wait returns as soon as the node gets
        there; ``timeout`` bounds it on a machine starting cold (a fresh clone's first run compiles every
        service's modules while the nodes burn in)."""
        pending = await self.wait_node(node_id, "pending_approval", timeout)
        await self.approve_node(node_id, pending["proposal"], wipe_policy)
        return await self.wait_node(node_id, "schedulable", timeout)

    async def set_bmc(self, node_id: str, url: str, system_id: str, username: str, password: str,
                      verify_tls: bool = True, ca_bundle: str | None = None) -> dict:
        """Register (or replace) the node's BMC; the answer never holds the password."""
        body = {"url": url, "system_id": system_id, "username": username, "password": password,
                "verify_tls": verify_tls, **({"ca_bundle": ca_bundle} if ca_bundle is not None else {})}
        return (await self.request("PUT", f"/v1/nodes/{node_id}/bmc", json_body=body, expect=(200,)))[1]

    async def bmc(self, node_id: str) -> dict:
        return (await self.request("GET", f"/v1/nodes/{node_id}/bmc", expect=(200,)))[1]

    async def delete_bmc(self, node_id: str) -> None:
        await self.request("DELETE", f"/v1/nodes/{node_id}/bmc", expect=(204,))

    async def validate_bmc(self, node_id: str) -> dict:
        """The node-agent's check of the registered BMC: {ok, error_kind, error, power_state, model, ...}."""
        return (await self.request("POST", f"/v1/nodes/{node_id}/bmc/validate", expect=(200,)))[1]

    async def run_burn_in(self, node_id: str) -> dict:
        return (await self.request("POST", f"/v1/nodes/{node_id}/burn-in", expect=(202,)))[1]

    async def rewipe(self, node_id: str, slot: int) -> dict:
        """Re-wipe a quarantined slot: {request_id, node_id, slot, requested_by}."""
        return (await self.request("POST", f"/v1/nodes/{node_id}/slots/{slot}/rewipe", expect=(202,)))[1]

    async def define_pool(self, name: str, policy: str = "pack", taints: dict | None = None,
                          timeout: float = 30.0) -> dict:
        """PUT the pool and wait until the scheduler has it (GET /v1/pools lists it with these settings)."""
        await self.request("PUT", f"/v1/pools/{name}", json_body={"policy": policy, "taints": taints or {}})

        async def defined():
            pools = (await self.request("GET", "/v1/pools"))[1]["items"]
            return next((p for p in pools if p["name"] == name and p["policy"] == policy
                         and p.get("version") is not None), None)
        return await _until(defined, timeout, f"pool {name} defined")

    async def set_quota(self, tenant_id: str, pool: str, gpu_model: str, limit: int, guaranteed: int = 0,
                        timeout: float = 30.0) -> dict:
        """PUT the tenant's quota and wait until the scheduler has applied it (GET shows it with a version)."""
        await self.request("PUT", f"/v1/tenants/{tenant_id}/quotas/{pool}/{gpu_model}",
                           json_body={"limit": limit, "guaranteed": guaranteed})

        async def applied():
            items = (await self.request("GET", f"/v1/tenants/{tenant_id}/quotas"))[1]["items"]
            return next((q for q in items if (q["pool"], q["gpu_model"]) == (pool, gpu_model)
                         and q["limit"] == limit and q.get("version") is not None), None)
        return await _until(applied, timeout, f"quota {pool}/{gpu_model} of tenant {tenant_id} applied")

    # -- tenant
    async def create_allocation(self, name: str, shape: str = "vm.1gpu", volume_gb: int = 0,
                                labels: dict | None = None, idempotency_key: str | None = None,
                                **options: Any) -> dict:
        """``options``: priority_class, spot, pool, tolerations, fail_fast, network_id."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        body = {"name": name, "shape": shape, "volume_gb": volume_gb, "labels": labels or {}, **options}
        return (await self.request("POST", "/v1/allocations", json_body=body, headers=headers, expect=(202,)))[1]

    async def allocation(self, allocation_id: str) -> dict:
        return (await self.request("GET", f"/v1/allocations/{allocation_id}"))[1]

    async def allocations(self, limit: int = 50, cursor: str | None = None) -> dict:
        q = f"?limit={limit}" + (f"&cursor={cursor}" if cursor else "")
        return (await self.request("GET", f"/v1/allocations{q}"))[1]

    async def release(self, allocation_id: str) -> dict:
        return (await self.request("DELETE", f"/v1/allocations/{allocation_id}", expect=(202,)))[1]

    async def wipe(self, allocation_id: str) -> dict:
        """The evidence of the allocation's slot wipes: {allocation_id, status, node_id, slots, wiped_at}."""
        return (await self.request("GET", f"/v1/allocations/{allocation_id}/wipe", expect=(200,)))[1]

    async def wait_wiped(self, allocation_id: str, timeout: float = 60.0) -> dict:
        """Poll the allocation's wipe until it is ``wiped`` or ``quarantined`` and return it."""
        async def done():
            w = await self.wipe(allocation_id)
            if w["status"] in ("wiped", "quarantined"):
                return w
            raise NotYet({"status": w["status"]})
        return await _until(done, timeout, f"allocation {allocation_id} wiped")

    # -- volumes
    async def storage_classes(self) -> list[dict]:
        return (await self.request("GET", "/v1/storage-classes"))[1]["items"]

    async def create_volume(self, name: str, size_bytes: int, storage_class: str | None = None,
                            shared: bool = False) -> dict:
        body = {"name": name, "size_bytes": size_bytes, "shared": shared,
                **({"storage_class": storage_class} if storage_class else {})}
        return (await self.request("POST", "/v1/volumes", json_body=body, expect=(202,)))[1]

    async def volume(self, volume_id: str) -> dict:
        return (await self.request("GET", f"/v1/volumes/{volume_id}"))[1]

    async def delete_volume(self, volume_id: str) -> dict:
        return (await self.request("DELETE", f"/v1/volumes/{volume_id}", expect=(202,)))[1]

    async def set_storage_quota(self, tenant_id: str, storage_class: str, max_bytes: int | None = None,
                                max_volumes: int | None = None) -> dict:
        body = {"max_bytes": max_bytes, "max_volumes": max_volumes}
        return (await self.request("PUT", f"/v1/tenants/{tenant_id}/storage-quotas/{storage_class}",
                                   json_body=body, expect=(202,)))[1]

    async def storage_quotas(self, tenant_id: str) -> dict:
        return (await self.request("GET", f"/v1/tenants/{tenant_id}/storage-quotas"))[1]

    async def wait_volume(self, volume_id: str, states: set[str] | str, timeout: float = 60.0) -> dict:
        """Poll the volume until it is in one of ``states``; WaitAborted at once when it was rejected or is in
        error (and that is not awaited), with its reason; a volume gone (404) counts as ``deleted``."""
        wanted = {states} if isinstance(states, str) else set(states)

        async def in_state():
            try:
                v = await self.volume(volume_id)
            except ApiError as exc:
                if exc.status == 404 and "deleted" in wanted:
                    return {"id": volume_id, "state": "deleted"}
                raise
            if v["state"] in wanted:
                return v
            raise NotYet(v)

        def hopeless(v: dict) -> str | None:
            if v.get("state") in ("rejected", "error", "deleted") and v["state"] not in wanted:
                return f"volume {volume_id} is {v['state']}: {v.get('reason') or 'no reason given'}"
            return None
        return await _until(in_state, timeout, f"volume {volume_id} {' or '.join(sorted(wanted))}", hopeless=hopeless)

    async def events(self, allocation_id: str) -> AsyncIterator[dict]:
        """Yield the allocation's events from its server-sent event stream (replay, then live)."""
        h = {"Authorization": f"Bearer {await self.token()}", "Accept": "text/event-stream"}
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        async with self.session.get(f"{self.base_url}/v1/allocations/{allocation_id}/events", headers=h, timeout=timeout) as r:
            if r.status != 200:
                raise ApiError(r.status, await r.text())
            data: list[str] = []
            async for raw in r.content:
                line = raw.decode().rstrip("\r\n")
                if line.startswith("data:"):
                    data.append(line[5:].lstrip())
                elif line == "" and data:
                    yield json.loads("\n".join(data))
                    data = []

    async def wait_state(self, allocation_id: str, states: set[str] | str, timeout: float = 60.0) -> dict:
        """Poll the allocation until it is in one of ``states`` and return it. As soon as it cannot get there any
        more (FAILED, or e.g. RELEASED while ACTIVE is awaited) raise WaitAborted saying why (for FAILED: the
        failed step and the reason; ``.last`` is the allocation); TimeoutError with its last state after ``timeout``."""
        wanted = {states} if isinstance(states, str) else set(states)

        async def in_state():
            a = await self.allocation(allocation_id)
            if a["state"] in wanted:
                return a
            raise NotYet(a)
        return await _until(in_state, timeout, f"allocation {allocation_id} {' or '.join(sorted(wanted))}",
                            hopeless=lambda a: unreachable(a, wanted))
