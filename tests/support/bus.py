"""The bus as tests use it: envelopes, publishing commands and events on their contract subjects,
watching subjects, and waiting until a service's consumer has handled a message."""
from __future__ import annotations

import json
import uuid

import nats

from shared.contract import Catalog, ServiceContract, load_catalog
from shared.envelope import Envelope, utcnow
from shared.runtime import Runtime
from shared.settings import BusSettings, ServiceSettings
from tests.support.polling import describe, eventually


def make_envelope(type_: str, data: dict, *, tenant_id: uuid.UUID | None = None, correlation_id: str | None = None) -> Envelope:
    return Envelope(id=uuid.uuid4(), type=type_, schema_version=1, occurred_at=utcnow(), tenant_id=tenant_id,
                    correlation_id=correlation_id or str(uuid.uuid4()), data=json.loads(json.dumps(data, default=str)))


async def publish_envelope(js, subject: str, env: Envelope, *, msg_id: str | None = None) -> None:
    headers = env.headers()
    if msg_id:
        headers["Nats-Msg-Id"] = msg_id
    await js.publish(subject, env.model_dump_json().encode(), headers=headers)


async def send_command(js, type_: str, data: dict, *, env: Envelope | None = None,
                       msg_id: str | None = None) -> tuple[Envelope, int]:
    """Publish a message on its contract subject (or re-publish ``env`` under another Nats-Msg-Id,
    which the server cannot dedupe); returns the envelope and its stream sequence."""
    from shared.contract import load_catalog

    corr = str(data["allocation_id"]) if data.get("allocation_id") else None
    env = env or make_envelope(type_, data, tenant_id=data.get("tenant_id"), correlation_id=corr)
    headers = env.headers()
    if msg_id:
        headers["Nats-Msg-Id"] = msg_id
    msg = load_catalog().message(type_)   # a subject that names a node: the node the payload names
    subject = msg.render_subject(**{p: str(data[p]) for p in msg.params}) if msg.params else msg.subject
    ack = await js.publish(subject, env.model_dump_json().encode(), headers=headers)
    return env, ack.seq


async def send_to_node(js, verb: str, node_id, data: dict, *, env: Envelope | None = None,
                       msg_id: str | None = None) -> tuple[Envelope, int]:
    """Publish a command to node_agent.cmd.<verb>.<node_id> (whatever node the payload names); returns
    (envelope, stream sequence)."""
    env = env or make_envelope(f"node_agent.{verb}", data, correlation_id=str(data["allocation_id"]))
    headers = env.headers() | ({"Nats-Msg-Id": msg_id} if msg_id else {})
    ack = await js.publish(f"node_agent.cmd.{verb}.{node_id}", env.model_dump_json().encode(), headers=headers)
    return env, ack.seq


async def publish_from_node(nc, type_: str, node_id, data: dict, tenant_id: str | None = None):
    """Play a node-agent, or who commands it: publish a node-agent message on its node's subject
    (node_agent.evt|cmd.<name>.<node id>), correlated by its allocation or else its node; returns the envelope."""
    subject = load_catalog().message(type_).render_subject(node_id=str(node_id))
    env = make_envelope(type_, data, tenant_id=uuid.UUID(str(tenant_id)) if tenant_id else None,
                        correlation_id=str(data.get("allocation_id") or node_id))
    await publish_envelope(nc.jetstream(), subject, env)
    return env


async def publish_event(js, type_: str, data: dict, *, tenant_id: uuid.UUID | str | None = None,
                        correlation_id: str | None = None) -> Envelope:
    """Play the event's owner: publish it on its contract subject (correlated by its allocation or node
    unless told); returns the envelope."""
    from shared.contract import load_catalog

    tenant = uuid.UUID(str(tenant_id)) if tenant_id else None
    corr = correlation_id or str(data.get("allocation_id") or data.get("node_id") or uuid.uuid4())
    env = make_envelope(type_, data, tenant_id=tenant, correlation_id=corr)
    await publish_envelope(js, load_catalog().message(type_).subject, env)
    return env


async def send_malformed_then_valid(js, watch, type_: str, cmd: dict, missing: str, valid: dict) -> str:
    """Send ``cmd`` without its ``missing`` field, then ``valid``, as ``type_``; assert the first is dead-lettered
    as invalid, naming the field. Returns the dead letter's subject."""
    dead = await watch(f"deadletter.{type_.split('.')[0]}.>")
    malformed = {k: v for k, v in cmd.items() if k != missing}
    env, _ = await send_command(js, type_, malformed)
    await send_command(js, type_, valid)
    [hit] = await dead.wait_for(lambda i: i[1]["id"] == str(env.id))
    assert hit[2]["Tessera-DLQ-Reason"] == "invalid" and missing in hit[2]["Tessera-DLQ-Error"]
    return hit[0]


def of(alloc, type_: str):
    """Predicate for StreamWatcher.wait_for: an envelope of ``type_`` about allocation ``alloc``."""
    return lambda i: i[1]["type"] == type_ and i[1]["data"].get("allocation_id") == str(alloc)


def caused_by(env: Envelope):
    """Predicate for StreamWatcher.wait_for: an envelope caused by ``env``."""
    return lambda i: i[1].get("causation_id") == str(env.id)


class StreamWatcher:
    """Collects envelopes from a subject (ephemeral ordered consumer) as (subject, envelope dict, headers)
    and waits for the ones a predicate picks."""

    def __init__(self):
        self.items: list[tuple[str, dict, dict]] = []
        self.subject = ""
        self.sub = None

    async def start(self, js, subject: str):
        self.subject = subject

        async def cb(msg):
            self.items.append((msg.subject, json.loads(msg.data), dict(msg.headers or {})))
        self.sub = await js.subscribe(subject, cb=cb, ordered_consumer=True,
                                      deliver_policy=nats.js.api.DeliverPolicy.NEW)
        return self

    async def wait_for(self, predicate, timeout: float = 20.0) -> list[tuple[str, dict, dict]]:
        """Every item seen so far that ``predicate`` picks, once there is at least one."""
        try:
            return await eventually(lambda: [i for i in self.items if predicate(i)], timeout=timeout, interval=0.01,
                                    what=f"a message on {self.subject} matching {describe(predicate)}")
        except AssertionError as e:
            raise AssertionError(f"{e}; {len(self.items)} message(s) seen, the last: {self.items[-3:]!r}") from None

    async def stop(self):
        if self.sub:
            await self.sub.unsubscribe()


async def wait_handled(js, service: str, type_: str, seq: int, timeout: float = 20.0) -> None:
    """Wait until ``service``'s consumer for ``type_`` has delivered stream seq ``seq`` and nothing awaits an ack."""
    from shared.contract import load_catalog

    stream = load_catalog().owner(type_).stream
    durable = f"{service}__{type_.replace('.', '_')}"
    await eventually(lambda: js.consumer_info(stream, durable), timeout=timeout, interval=0.02,
                     until=lambda info: info.num_ack_pending == 0 and info.delivered.stream_seq >= seq,
                     what=f"{durable} to handle seq {seq}")


async def wait_acked(js, stream: str, durable: str, seq: int, timeout: float = 20.0):
    """Wait until the consumer has acknowledged everything up to stream sequence ``seq``; returns its info."""
    return await eventually(lambda: js.consumer_info(stream, durable), timeout=timeout,
                            until=lambda info: info.ack_floor.stream_seq >= seq and info.num_ack_pending == 0,
                            what=f"{durable} to acknowledge up to seq {seq}")


def probe_runtime(contract: ServiceContract, nats_url: str, db_dsn: str, *, nkey_file: str | None = None,
                  **bus) -> Runtime:
    """A runtime for a test-only service with its own contract (added to the real catalog): quick retries
    (3 deliveries, 0.05 s then 0.1 s apart, ack_wait 5 s) unless ``bus`` (BusSettings fields) says otherwise.
    Its stream is the test's to create. No contract of the catalog names it, so no bus permission either: it
    connects as ``nkey_file``, the harness's ``admin`` (``infra.nkey_file("admin")``)."""
    bus = {"ack_wait_s": 5, "max_deliver": 3, "retry_backoff_s": (0.05, 0.1), **bus}
    settings = ServiceSettings(service=contract.service, nats_url=nats_url, nats_nkey_file=nkey_file, db_dsn=db_dsn,
                               bus=BusSettings(**bus))
    return Runtime(settings, catalog=Catalog([*load_catalog().contracts.values(), contract]))
