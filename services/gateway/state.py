"""What the HTTP handlers share, under one typed application key."""
from __future__ import annotations

from dataclasses import dataclass, field

import asyncpg
from aiohttp import web
from nats.js import JetStreamContext

from shared.outbox import Outbox
from shared.runtime import Runtime

from .adapters.allocations import EVENTS_CHANNEL
from .auth import TokenIssuer
from .sse import AllocationEventHub, StreamRegistry


@dataclass
class GatewayConfig:
    """The gateway's own settings (bootstrap reads them from the environment)."""

    token_secret: str
    token_ttl_s: int = 900
    bootstrap_admin_key: str | None = None
    idempotency_ttl_s: float = 24 * 3600.0
    stream_poll_s: float = 5.0


@dataclass
class Gateway:
    rt: Runtime
    config: GatewayConfig
    tokens: TokenIssuer = field(init=False)
    hub: AllocationEventHub = field(default_factory=lambda: AllocationEventHub(EVENTS_CHANNEL))
    streams: StreamRegistry = field(default_factory=StreamRegistry)

    def __post_init__(self) -> None:
        self.tokens = TokenIssuer(self.config.token_secret, self.config.token_ttl_s)

    @property
    def pool(self) -> asyncpg.Pool:
        return self.rt.pool

    @property
    def outbox(self) -> Outbox:
        return self.rt.outbox

    @property
    def js(self) -> JetStreamContext:
        return self.rt.js


GATEWAY = web.AppKey("gateway", Gateway)


def gateway_of(request: web.Request) -> Gateway:
    return request.app[GATEWAY]
