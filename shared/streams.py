"""The JetStream streams the project declares: one per service (its commands and events; its requests,
<service>.rpc.*, are core NATS request/reply and never stored), plus the dead-letter stream.

Every service declares all of them at start (idempotently, with one config), so
no service depends on another having started first.
"""
from __future__ import annotations

from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

from .contract import SERVICES, stream_name

DEAD_LETTER_STREAM = "TESSERA_DEADLETTER"
DEAD_LETTER_PREFIX = "deadletter"
DUPLICATE_WINDOW_S = 120.0


def stream_configs(replicas: int = 1) -> list[StreamConfig]:
    configs = [
        StreamConfig(
            name=stream_name(s), subjects=[f"{s}.cmd.>", f"{s}.evt.>"], storage=StorageType.FILE,
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


async def declare_streams(js: JetStreamContext, replicas: int = 1) -> None:
    for cfg in stream_configs(replicas):
        try:
            await js.stream_info(cfg.name)
            await js.update_stream(cfg)
        except NotFoundError:
            await js.add_stream(cfg)
