"""The JetStream streams the project declares: one per service (its commands and events; its requests,
<service>.rpc.*, are core NATS request/reply and never stored, and so are its live events, such as the
node-agents' heartbeats), plus the dead-letter stream.

A service declares (creates or updates, idempotently, with one config) its own stream and the dead-letter
stream, where it publishes what it cannot handle; the streams of others that it reads it only creates when
they do not exist yet (``ensure_streams``), with the same configuration, so that no service depends on
another having started first (the node-agents' stream, say, exists before the first node-agent starts).
Its bus permissions (``tooling.bus_permissions``) allow exactly that: update only its own two, never
delete or purge. Operator tooling and the test harness (the ``admin`` identity) declare them all
(``declare_streams`` without ``names``).
"""
from __future__ import annotations

from collections.abc import Iterable

from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError, NotFoundError

from .contract import SERVICES, load_catalog, stream_name

DEAD_LETTER_STREAM = "TESSERA_DEADLETTER"
DEAD_LETTER_PREFIX = "deadletter"
DUPLICATE_WINDOW_S = 120.0


def stream_subjects(service: str) -> list[str]:
    """The subjects ``service``'s stream stores: its commands and its events, live events (``Message.live``)
    excepted. A stream cannot exclude a subject, so a service with live events has its others listed one by one
    instead of ``<service>.evt.>``."""
    contract = load_catalog().contracts[service]
    if not any(m.live for m in contract.messages):
        return [f"{service}.cmd.>", f"{service}.evt.>"]
    events = sorted({m.wildcard() for m in contract.messages if m.kind == "event" and not m.live})
    return [f"{service}.cmd.>", *events]


def stream_configs(replicas: int = 1) -> list[StreamConfig]:
    configs = [
        StreamConfig(
            name=stream_name(s), subjects=stream_subjects(s), storage=StorageType.FILE,
            retention=RetentionPolicy.LIMITS, discard=DiscardPolicy.OLD,
            max_age=7 * 24 * 3600.0, max_bytes=1 << 30, duplicate_window=DUPLICATE_WINDOW_S,
            num_replicas=replicas,
        )
        for s in SERVICES
    ]
    configs.append(StreamConfig(
        name=DEAD_LETTER_STREAM, subjects=[f"{DEAD_LETTER_PREFIX}.>"], storage=StorageType.FILE,
        retention=RetentionPolicy.LIMITS, max_age=30 * 24 * 3600.0, duplicate_window=DUPLICATE_WINDOW_S,
        num_replicas=replicas,
    ))
    return configs


def own_streams(service: str) -> list[str]:
    """The streams ``service`` declares: its own (when it is one of the project's) and the dead-letter stream."""
    return [*([stream_name(service)] if service in SERVICES else []), DEAD_LETTER_STREAM]


async def declare_streams(js: JetStreamContext, replicas: int = 1, *, names: Iterable[str] | None = None) -> None:
    """Create or update the streams ``names`` (default: all of them) with the project's configuration."""
    wanted = None if names is None else set(names)
    for cfg in stream_configs(replicas):
        if wanted is not None and cfg.name not in wanted:
            continue
        try:
            await js.stream_info(cfg.name)
            await js.update_stream(cfg)
        except NotFoundError:
            await js.add_stream(cfg)


async def ensure_streams(js: JetStreamContext, names: Iterable[str], replicas: int = 1) -> None:
    """Create those of the streams ``names`` that do not exist yet, with the project's configuration; leave the
    others as they are (their owners keep them up to date)."""
    wanted = set(names)
    for cfg in stream_configs(replicas):
        if cfg.name not in wanted:
            continue
        try:
            await js.stream_info(cfg.name)
        except NotFoundError:
            try:
                await js.add_stream(cfg)
            except BadRequestError:   # another service created it meanwhile (the same configuration is accepted)
                await js.stream_info(cfg.name)
