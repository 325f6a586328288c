"""Settings: one frozen object per service, built from the environment by one helper.

A service declares its settings as a frozen dataclass whose fields are ``setting(VAR, default, reader)``:
the variable that sets the field, the value used when the variable is unset or empty, and how to read the
text. ``load(SettingsClass, environ)`` builds the object once, in bootstrap (never at import time), and
refuses a bad value with a ``SettingError`` naming the variable, its value and what it must be. A field
whose type is itself a settings class (with a ``default_factory``) is loaded the same way.

``describe(SettingsClass)`` lists (variable, default, meaning) for documentation; the kit's own settings
(``ServiceSettings``) are every service's, the service's ``settings.py`` holds the rest.
"""
from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")
Reader = Callable[[str], Any]


class SettingError(ValueError):
    """A setting that cannot be used; the message names the variable and what it must be."""


def setting(var: str, default: Any = None, read: Reader | None = None, *, doc: str = "",
            default_factory: Callable[[], Any] | None = None) -> Any:
    """A settings field set by the environment variable ``var`` (read with ``read``, plain text by default)."""
    meta = {"env": var, "read": read or text, "doc": doc}
    if default_factory is not None:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


def load(cls: type[T], environ: Mapping[str, str] | None = None, **overrides: Any) -> T:
    """Build ``cls`` from ``environ`` (default: os.environ); ``overrides`` win over the environment.
    Raises SettingError naming the first variable whose value cannot be used."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in overrides:
            values[f.name] = overrides.pop(f.name)
        elif "env" in f.metadata:
            raw = (environ.get(f.metadata["env"]) or "").strip()
            if raw:
                values[f.name] = _read(f.metadata["env"], raw, f.metadata["read"])
        elif _nested(cls, f):
            values[f.name] = load(_nested(cls, f), environ)
    if overrides:
        raise TypeError(f"{cls.__name__} has no setting(s) {', '.join(sorted(overrides))}")
    return cls(**values)


def _nested(cls: type, f: dataclasses.Field) -> type | None:
    kind = f.default_factory if f.default_factory is not dataclasses.MISSING else None
    return kind if isinstance(kind, type) and dataclasses.is_dataclass(kind) else None


def _read(var: str, raw: str, read: Reader) -> Any:
    try:
        return read(raw)
    except (ValueError, TypeError) as exc:
        what = getattr(read, "what", None) or str(exc)
        raise SettingError(f"{var}={raw!r} is not {what}") from None


def describe(cls: type) -> Iterator[tuple[str, Any, str]]:
    """(variable, default, meaning) of every setting of ``cls`` and of its nested settings."""
    for f in dataclasses.fields(cls):
        if "env" in f.metadata:
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
            yield f.metadata["env"], default, f.metadata["doc"]
        elif _nested(cls, f):
            yield from describe(_nested(cls, f))


# --- readers: each raises ValueError and says (``what``) what the text must be ---------------------------------
def _reader(what: str):
    def wrap(fn: Reader) -> Reader:
        fn.what = what   # type: ignore[attr-defined]
        return fn
    return wrap


def text(raw: str) -> str:
    return raw


text.what = "text"   # type: ignore[attr-defined]


def integer(minimum: int | None = None, maximum: int | None = None) -> Reader:
    what = "an integer" + (f" ≥ {minimum}" if minimum is not None else "") + (f" ≤ {maximum}" if maximum is not None else "")

    @_reader(what)
    def read(raw: str) -> int:
        value = int(raw, 0) if raw.lower().startswith("0x") else int(raw)
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            raise ValueError(raw)
        return value
    return read


def number(minimum: float | None = None, *, positive: bool = False) -> Reader:
    what = "a positive number" if positive else "a number" + (f" ≥ {minimum}" if minimum is not None else "")

    @_reader(what)
    def read(raw: str) -> float:
        value = float(raw)
        if value != value or (positive and value <= 0) or (minimum is not None and value < minimum):
            raise ValueError(raw)
        return value
    return read


@_reader("a comma-separated list of non-negative numbers")
def numbers(raw: str) -> tuple[float, ...]:
    values = tuple(float(x) for x in raw.split(","))
    if not values or any(v < 0 or v != v for v in values):
        raise ValueError(raw)
    return values


@_reader("1 or 0 (also true/false, yes/no, on/off)")
def flag(raw: str) -> bool:
    value = raw.lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(raw)


def choice(*options: str) -> Reader:
    @_reader("one of " + ", ".join(options))
    def read(raw: str) -> str:
        if raw not in options:
            raise ValueError(raw)
        return raw
    return read


@_reader("a UUID")
def uuid_(raw: str) -> uuid.UUID:
    return uuid.UUID(raw)


@_reader("a port number")
def port(raw: str) -> int:
    value = int(raw)
    if not 0 <= value <= 65535:
        raise ValueError(raw)
    return value


@_reader("a readable file")
def readable_file(raw: str) -> str:
    if not os.access(raw, os.R_OK) or not os.path.isfile(raw):
        raise ValueError(raw)
    return raw


@_reader("one of DEBUG, INFO, WARNING, ERROR")
def log_level(raw: str) -> str:
    if raw.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ValueError(raw)
    return raw.upper()


# --- the kit's settings: every service has these ---------------------------------------------------------------
@dataclass(frozen=True)
class BusSettings:
    """JetStream consumer policy shared by every service. A handler still running sends in-progress heartbeats
    every third of ack_wait (see shared.batches), so ack_wait bounds only how long the message of a process that
    died stays unanswered: well below the saga's step timeout (30 s), so that the restarted process (or another
    replica) completes that work before its step times out."""

    ack_wait_s: float = setting("TESSERA_ACK_WAIT_S", 10.0, number(positive=True),
                                doc="seconds a delivered message may stay unacknowledged before redelivery (a "
                                    "handler still running extends it); keep it well below the saga's step timeout")
    max_deliver: int = setting("TESSERA_MAX_DELIVER", 5, integer(1),
                               doc="deliveries of a failing message before it goes to the dead-letter stream")
    retry_backoff_s: tuple[float, ...] = setting("TESSERA_RETRY_BACKOFF_S", (0.2, 1.0, 3.0, 10.0), numbers,
                                                 doc="waits before each redelivery of a failed message; the last repeats")
    max_workers: int = setting("TESSERA_MAX_WORKERS", 4, integer(1),
                               doc="batches (transactions) one consumer handles at once")
    batch_size: int = setting("TESSERA_CONSUMER_BATCH", 32, integer(1, 256),
                              doc="messages one consumer handles in one transaction at most")
    fetch_wait_s: float = setting("TESSERA_FETCH_WAIT_S", 5.0, number(positive=True),
                                  doc="seconds an idle consumer waits for a message before it reports its lag again")
    pull_expires_s: float = setting("TESSERA_PULL_EXPIRES_S", 30.0, number(positive=True),
                                    doc="seconds a consumer's open pull request lasts on the server before it is "
                                        "renewed (also renewed at once on every reconnect)")


@dataclass(frozen=True)
class ServiceSettings:
    """What every service process reads: where the bus and its database are, how it serves and logs."""

    service: str
    nats_url: str = setting("TESSERA_NATS_URL", "nats://127.0.0.1:4222",
                            doc="the NATS server, or a cluster's servers separated by commas (the client tries each "
                                "at start and on reconnect, so a service starts while any one of them is up)")
    nats_nkey_file: str | None = setting("TESSERA_NATS_NKEY_FILE", None, readable_file,
                                         doc="the file holding this service's NATS nkey seed, its identity on the bus "
                                             "(unset: connect without credentials, to a server without authorization)")
    nats_ca_file: str | None = setting("TESSERA_NATS_CA_FILE", None, readable_file,
                                       doc="the CA certificate that signed the NATS server's: connect over TLS and verify "
                                           "the server's certificate and name against it (unset: a plain connection, "
                                           "for the embedded server on loopback)")
    db_dsn: str = setting("TESSERA_DB_DSN", "postgresql://postgres@127.0.0.1:5432/tessera",
                          doc="the service's own PostgreSQL role and database")
    http_host: str = setting("TESSERA_HTTP_HOST", "127.0.0.1", doc="address of the health/metrics (and API) server")
    http_port: int = setting("TESSERA_HTTP_PORT", 0, port, doc="its port (0: any free port)")
    instance: str = setting("TESSERA_INSTANCE", "0", doc="this replica's name (the node id for a node-agent)")
    log_level: str = setting("TESSERA_LOG_LEVEL", "INFO", log_level, doc="DEBUG, INFO, WARNING or ERROR")
    trace_file: str | None = setting("TESSERA_TRACE_FILE", None, doc="write OpenTelemetry spans to this file (JSON lines)")
    sim_faults: bool = setting("TESSERA_SIM_FAULTS", False, flag,
                               doc="honour the sim.tessera.io/fault label (fault injection; never in production)")
    stream_replicas: int = setting("TESSERA_STREAM_REPLICAS", 1, integer(1), doc="replicas of each JetStream stream")
    bus: BusSettings = field(default_factory=BusSettings)

    @property
    def nats_servers(self) -> list[str]:
        """``nats_url`` split at its commas."""
        return [u.strip() for u in self.nats_url.split(",") if u.strip()]

    @classmethod
    def from_env(cls, service: str, environ: Mapping[str, str] | None = None, **overrides: Any) -> ServiceSettings:
        return load(cls, environ, service=service, **overrides)
