"""What the HTTP handlers share, under one typed application key."""
from __future__ import annotations

from dataclasses import dataclass, field

import asyncpg
from aiohttp import web
from nats.js import JetStreamContext

from shared.outbox import Outbox
from shared.runtime import Runtime
from shared.unit_of_work import UnitOfWork

from ..adapters.allocations import EVENTS_CHANNEL
from ..settings import GatewaySettings
from .audit_writer import AuditWriter
from .auth import TokenIssuer
from .policy_cache import PolicyCache
from .sse import AllocationEventHub, StreamRegistry


@dataclass
class Gateway:
    rt: Runtime
    config: GatewaySettings
    tokens: TokenIssuer = field(init=False)
    # the platform's key that seals BMC passwords (read once, here; None: none configured, a BMC PUT is a 503)
    secret_key: bytes | None = field(init=False, repr=False)
    hub: AllocationEventHub = field(default_factory=lambda: AllocationEventHub(EVENTS_CHANNEL))
    streams: StreamRegistry = field(default_factory=StreamRegistry)
    # the policies in force (http/policy.py), made with the policy middleware, which needs this object first
    policy_cache: PolicyCache | None = field(default=None, init=False)
    # the audit chain's group-committing writer (http/audit.py), made with the first record
    audit_writer: AuditWriter | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.tokens = TokenIssuer(self.config.token_secret, self.config.token_ttl_s)
        self.secret_key = self.config.platform_key()

    @property
    def pool(self) -> asyncpg.Pool:
        return self.rt.pool

    @property
    def outbox(self) -> Outbox:
        return self.rt.outbox

    @property
    def js(self) -> JetStreamContext:
        return self.rt.js

    def unit_of_work(self, name: str):
        """A transaction whose outbox messages this process's relay publishes as soon as it commits."""
        return UnitOfWork.begin(self.pool, self.outbox, name=name)


GATEWAY = web.AppKey("gateway", Gateway)


def gateway_of(request: web.Request) -> Gateway:
    return request.app[GATEWAY]
