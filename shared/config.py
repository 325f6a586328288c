"""Service settings, read from the environment once, in bootstrap (never at import time)."""
from __future__ import annotations

import os

from pydantic import BaseModel, Field


def _env(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else default


def _parse(name: str, default: str, cast, what: str):
    """Read and convert one variable; raises ValueError naming the variable and what it must be."""
    raw = _env(name, default)
    try:
        return cast(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not {what}") from None


def _floats(raw: str) -> list[float]:
    values = [float(x) for x in raw.split(",")]
    if not values or any(v < 0 for v in values):
        raise ValueError(raw)
    return values


def _positive_int(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise ValueError(raw)
    return value


class BusSettings(BaseModel):
    """JetStream consumer policy shared by every service.

    ack_wait must exceed the slowest handler; handlers that may run longer send
    in-progress heartbeats (see shared.consumer).
    """

    ack_wait_s: float = 30.0
    max_deliver: int = 5
    retry_backoff_s: list[float] = Field(default_factory=lambda: [0.2, 1.0, 3.0, 10.0])
    max_workers: int = 8


class ServiceSettings(BaseModel):
    service: str
    nats_url: str = "nats://127.0.0.1:4222"
    db_dsn: str = "postgresql://postgres@127.0.0.1:5432/tessera"
    http_host: str = "127.0.0.1"
    http_port: int = 0
    instance: str = "0"
    log_level: str = "INFO"
    trace_file: str | None = None
    sim_faults: bool = False
    stream_replicas: int = 1
    bus: BusSettings = Field(default_factory=BusSettings)

    @classmethod
    def from_env(cls, service: str, **overrides) -> "ServiceSettings":
        bus = BusSettings(
            ack_wait_s=_parse("TESSERA_ACK_WAIT_S", "30", float, "a number of seconds"),
            max_deliver=_parse("TESSERA_MAX_DELIVER", "5", _positive_int, "a positive integer"),
            retry_backoff_s=_parse("TESSERA_RETRY_BACKOFF_S", "0.2,1,3,10", _floats, "a comma list of seconds"),
            max_workers=_parse("TESSERA_MAX_WORKERS", "8", _positive_int, "a positive integer"),
        )
        values = dict(
            service=service,
            nats_url=_env("TESSERA_NATS_URL", "nats://127.0.0.1:4222"),
            db_dsn=_env("TESSERA_DB_DSN", "postgresql://postgres@127.0.0.1:5432/tessera"),
            http_host=_env("TESSERA_HTTP_HOST", "127.0.0.1"),
            http_port=_parse("TESSERA_HTTP_PORT", "0", int, "a port number"),
            instance=_env("TESSERA_INSTANCE", "0"),
            log_level=_env("TESSERA_LOG_LEVEL", "INFO"),
            trace_file=_env("TESSERA_TRACE_FILE"),
            sim_faults=_env("TESSERA_SIM_FAULTS", "0") == "1",
            stream_replicas=_parse("TESSERA_STREAM_REPLICAS", "1", _positive_int, "a positive integer"),
            bus=bus,
        )
        values.update(overrides)
        return cls(**values)
