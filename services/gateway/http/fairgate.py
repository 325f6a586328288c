"""Tenants served fairly inside one gateway replica: each tenant has at most ``per_tenant × weight`` requests
worked on at once; its other requests wait, in their order, for one of its own to end.

The rate limits bound what each tenant may send per second; within those bounds a tenant's 16 clients would
otherwise all be worked on at once, and another tenant's one request would share the process's one event loop
with all their work. With the gate, a tenant's many clients cost the replica what ``per_tenant`` requests cost,
and never delay the start of another tenant's request: each tenant waits only behind itself (as Kubernetes'
API priority and fairness gives each flow its share of seats). The weight is the tenant's plan
(``PATCH /v1/tenants/{id}``, ``shared.fairness``).

It runs right after the shedder, knowing the tenant from a token this replica authenticated before
(``TokenIssuer.known``, memory only): a request whose token it does not know yet, a provider admin's, an
unauthenticated one, an event stream or a WebSocket (held open for minutes) pass at once.
"""
from __future__ import annotations

import asyncio
import uuid
from collections import deque

from aiohttp import web

from shared import fairness

from .auth import known_principal
from .endpoint import EVENT_STREAM


class _Line:
    """One tenant's requests in the handler (``busy``) and those waiting their turn, in order."""

    def __init__(self) -> None:
        self.busy = 0
        self.waiting: deque[asyncio.Future] = deque()


class TenantGate:
    """``enter`` takes one of the tenant's slots or waits for one; ``leave`` hands it to the tenant's next
    waiting request (one whose client is gone is skipped)."""

    def __init__(self, per_tenant: int):
        self.per_tenant = per_tenant
        self._lines: dict[str, _Line] = {}

    def busy(self, tenant: str) -> int:
        line = self._lines.get(tenant)
        return line.busy if line else 0

    async def enter(self, tenant: str, weight: int = fairness.DEFAULT_WEIGHT) -> None:
        line = self._lines.setdefault(tenant, _Line())
        if line.busy < self.per_tenant * weight and not line.waiting:
            line.busy += 1
            return
        turn = asyncio.get_running_loop().create_future()
        line.waiting.append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():   # handed the slot as the client went away: pass it on
                self.leave(tenant)
            raise

    def leave(self, tenant: str) -> None:
        line = self._lines[tenant]
        while line.waiting:
            turn = line.waiting.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        line.busy -= 1
        if line.busy == 0:
            del self._lines[tenant]   # an idle tenant keeps nothing


def fair_gate_middleware(gw, per_tenant: int):
    """The gate as a middleware (``per_tenant`` 0: no gate)."""
    gate = TenantGate(per_tenant)

    @web.middleware
    async def fair(request: web.Request, handler) -> web.StreamResponse:
        tenant = _tenant_of(gw, request) if per_tenant else None
        if tenant is None:
            return await handler(request)
        line = str(tenant)
        await gate.enter(line, fairness.weights.get(tenant) or fairness.DEFAULT_WEIGHT)
        try:
            return await handler(request)
        finally:
            gate.leave(line)

    return fair


def _tenant_of(gw, request: web.Request) -> uuid.UUID | None:
    """The tenant of a request the gate orders; None for those that pass at once."""
    path, headers = request.path, request.headers
    if (not path.startswith("/v1/") or path.endswith("/events") or EVENT_STREAM in headers.get("Accept", "")
            or headers.get("Upgrade", "").lower() == "websocket"):
        return None
    principal = known_principal(gw.tokens, request)
    if principal is None or principal.is_provider_admin:
        return None
    return principal.tenant_id
