"""Contracts as code: every message type, its subject and its pydantic payload model.

Each service's ``contracts.py`` declares the messages it *owns* (the commands it
accepts and the events it emits) as a ``ServiceContract``. The catalog gathers
them all. The AsyncAPI documents under ``contracts/asyncapi/`` are generated from
the catalog (``python -m tooling.asyncapi``) and a contract test keeps the
committed documents equal to the generated ones. At run time the outbox refuses
to publish, and the consumer refuses to subscribe to, anything the catalog does
not define.
"""
from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel

if TYPE_CHECKING:
    from .steps import Step

SERVICES = ("gateway", "allocation", "saga", "scheduler", "network", "storage", "billing", "paas", "node_agent")


class ContractViolation(Exception):
    """Code tried to publish or subscribe to something no contract defines."""


@dataclass(frozen=True)
class Message:
    type: str                      # "<service>.<name>", unique
    subject: str                   # may hold {params}, e.g. node_agent.cmd.provision.{node_id}
    model: type[BaseModel]
    kind: Literal["command", "event", "request"]
    summary: str
    version: int = 1
    # kind "request" only: the answer's model. A request is core NATS request/reply (shared.rpc): never stored
    # in a stream (its subject is <service>.rpc.*, outside the streams' cmd/evt subjects), answered at once or
    # not at all; for reads that must be live (a console's tail), never for a change of state.
    reply: type[BaseModel] | None = None
    # an event only: published live (a plain core-NATS publish, not through the outbox) and never stored; its
    # service's stream leaves its subject out (shared.streams). For proof that the sender is connected now (a
    # heartbeat), which a copy replayed from a stream must never seem to give. Received with Runtime.listen.
    live: bool = False

    @property
    def name(self) -> str:
        """The type without its service: ``provision`` for ``node_agent.provision``."""
        return self.type.split(".", 1)[1]

    @property
    def params(self) -> list[str]:
        return re.findall(r"\{(\w+)\}", self.subject)

    def render_subject(self, **params: str) -> str:
        try:
            return self.subject.format(**params)
        except KeyError as exc:
            raise ContractViolation(f"{self.type}: subject parameter {exc} missing") from None

    def wildcard(self) -> str:
        return re.sub(r"\{\w+\}", "*", self.subject)

    def matches(self, subject: str) -> bool:
        pattern = "^" + re.sub(r"\\\{\w+\\\}", r"[^.]+", re.escape(self.subject)) + "$"
        return re.match(pattern, subject) is not None


@dataclass
class ServiceContract:
    """What a service owns (``messages``), consumes (``receives``) and sends of others' (``sends``). The saga
    steps it performs (``steps``, see shared.steps) add their messages to ``messages`` and their commands
    to ``receives``."""

    service: str
    title: str
    description: str
    messages: list[Message]
    receives: list[str] = field(default_factory=list)   # message types (owned by others or itself) it consumes
    sends: list[str] = field(default_factory=list)      # commands owned by others that it sends
    steps: list[Step] = field(default_factory=list)     # saga steps it performs

    def __post_init__(self) -> None:
        for step in self.steps:
            if not step.command.type.startswith(self.service + "."):
                raise ContractViolation(f"{self.service} declares {step.command.type}, a step of another service")
            self.messages = [*self.messages, *step.messages]
            self.receives = [*self.receives, *(m.type for m in step.commands)]

    @property
    def stream(self) -> str:
        return stream_name(self.service)


def stream_name(service: str) -> str:
    return "TESSERA_" + service.upper()


def durable_name(service: str, type_: str) -> str:
    """The durable consumer through which ``service`` receives ``type_`` (``shared.consumer`` names it so unless
    told otherwise; the bus permissions, ``tooling.bus_permissions``, allow exactly these names)."""
    return f"{service}__{type_.replace('.', '_')}"


class Catalog:
    def __init__(self, contracts: list[ServiceContract]):
        self.contracts = {c.service: c for c in contracts}
        self.by_type: dict[str, tuple[ServiceContract, Message]] = {}
        for c in contracts:
            for m in c.messages:
                if m.type in self.by_type:
                    raise ContractViolation(f"duplicate message type {m.type}")
                if not m.subject.startswith(c.service + "."):
                    raise ContractViolation(f"{m.type}: subject {m.subject} outside {c.service}.>")
                infix = {"command": "cmd", "event": "evt", "request": "rpc"}[m.kind]
                if not m.subject.startswith(f"{c.service}.{infix}."):
                    raise ContractViolation(f"{m.type}: a {m.kind}'s subject starts {c.service}.{infix}.")
                if m.live and m.kind != "event":
                    raise ContractViolation(f"{m.type}: only an event is published live")
                if (m.kind == "request") != (m.reply is not None):
                    raise ContractViolation(f"{m.type}: a request, and only a request, has a reply model")
                self.by_type[m.type] = (c, m)

    def message(self, type_: str) -> Message:
        try:
            return self.by_type[type_][1]
        except KeyError:
            raise ContractViolation(f"no contract defines message type {type_!r}") from None

    def owner(self, type_: str) -> ServiceContract:
        self.message(type_)
        return self.by_type[type_][0]

    def check_send(self, service: str, type_: str, subject: str) -> Message:
        owner, msg = self.owner(type_), self.message(type_)
        allowed = owner.service == service if msg.kind == "event" else (   # a command or a request
            owner.service == service or type_ in self.contracts[service].sends)
        if not allowed:
            raise ContractViolation(f"{service} may not send {type_}: not in its contract")
        if not msg.matches(subject):
            raise ContractViolation(f"{type_} is not published on {subject} (contract: {msg.subject})")
        return msg

    def check_receive(self, service: str, type_: str) -> Message:
        msg = self.message(type_)
        if type_ not in self.contracts[service].receives:
            raise ContractViolation(f"{service} does not declare that it receives {type_}")
        return msg


_catalog: Catalog | None = None


def load_catalog() -> Catalog:
    """Import every service's contracts module (pure pydantic, no I/O) and build the catalog."""
    global _catalog
    if _catalog is None:
        contracts = [importlib.import_module(f"services.{s}.contracts").CONTRACT for s in SERVICES]
        _catalog = Catalog(contracts)
    return _catalog
