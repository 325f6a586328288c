"""Generate every identity's NATS permissions from the contract catalog.

``python -m tooling.bus_permissions`` writes ``contracts/asyncapi/nats-permissions.json``;
``python -m tooling.bus_permissions --check`` writes nothing and exits 1, showing the difference, when the
committed file is not what the catalog generates. The embedded runner (``tooling.embedded``) renders the
server's ``authorization`` block from the same functions, so what runs is what is committed.

Identities. One per service (``SERVICE_IDENTITIES``; every replica of a service shares it), one per node for
the node-agents (``node_agent_<node id in hex>``, ``node_permissions``: the committed file holds its template,
``node_agent_{node_hex}`` with ``{node_id}`` in its subjects), plus ``ops`` (read-only: operators' tools) and
``admin`` (everything: operator tooling and the test harness, like PostgreSQL's superuser; never a service).
An identity is an NATS nkey: the server's configuration holds only public keys, each process holds its own
seed (``TESSERA_NATS_NKEY_FILE``), and the server checks a signature of a fresh nonce at every connect, so
neither the configuration nor the traffic carries anything a reader could replay. Nothing argued for passwords
or tokens instead (nats-py and faststream take a seed file as they take a password), and nkeys are what NATS's
decentralised JWT accounts build on, should the cluster move to them.

What each service may do, derived from the catalog (``ServiceContract.messages/receives/sends``):

- publish its events and the commands and requests of others in its ``sends`` (``Catalog.check_send`` also
  lets an owner send its own commands; no service does, so no permission allows it), its dead letters
  (``deadletter.<service>.>``, see ``shared.batches``), and the JetStream API calls its kit makes: account info;
  info, create and update of its own stream and of the dead-letter stream (``shared.streams``: a service
  declares only those), info and create of the streams it reads (it creates one only when it does not exist
  yet, with the project's configuration, so that services start in any order; only the owner updates it,
  nobody deletes or purges it); for each durable consumer (``shared.consumer``, one per received message type,
  named ``contract.durable_name``): consumer info, create (only the named form, whose subject carries the
  filter: the server refuses a create whose filter differs from the subject's, so a service can only ever read
  what it receives), next message, and the acknowledgements of that consumer;
- answer the requests it owns (``shared.rpc``) through ``allow_responses``: a reply goes to the asker's
  inbox, only once, only in answer to a request it received, with no publish right on any inbox;
- subscribe to what it receives (a listener is a plain subscription), the requests it owns, and its own
  inbox, ``_INBOX_<identity>.>`` (``shared.bus_identity``): each identity has an inbox prefix of its own,
  so no identity can read the replies and JetStream deliveries of another, as a shared ``_INBOX.>`` would
  allow.

A node-agent speaks only for its node: it publishes its events on its node's subjects only
(``node_agent.evt.<name>.<node id>``), subscribes to its node's commands and requests only, consumes through
its node's durables only (``node_agent_<hex>__<name>``, ``shared.bus_identity.node_durable``), each filtered on
its node's subject, and dead-letters under those durables' names. (The consumers of its events also check that
the payload's node is the subject's: ``shared.batches``, reason ``forged``.)

The gateway also reads the streams for the operators' live feed and the dead-letter page
(``services.gateway.api.ops.routes``): ephemeral ordered consumers on every stream (create, flow-control
answers) and reads of the dead-letter stream's messages. ``ops`` may read every stream the
same way (ephemeral ordered consumers, stream and consumer info, message reads) and subscribe to every
service's events; it publishes nothing else: ordered consumers acknowledge nothing, and an identity
allowed ``$JS.ACK.<stream>.*.>`` could settle (drop) a service's messages, which is not reading.

Pure: no I/O except in ``write``/``main``; the output is deterministic (sorted).
"""
from __future__ import annotations

import json
import re
import sys
import uuid
from pathlib import Path
from typing import Any

from shared.bus_identity import NODE_AGENT, inbox_prefix, node_durable_suffix, node_identity
from shared.contract import SERVICES, Catalog, Message, ServiceContract, durable_name, load_catalog, stream_name
from tooling.generated import check_or_write, text_diff

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_FILE = ROOT / "contracts" / "asyncapi" / "nats-permissions.json"
OPS, ADMIN = "ops", "admin"
SERVICE_IDENTITIES = tuple(s for s in SERVICES if s != NODE_AGENT)   # a node-agent is its node's identity
IDENTITIES = (*SERVICE_IDENTITIES, OPS, ADMIN)                        # those every installation has
NODE_TEMPLATE = f"{NODE_AGENT}_{{node_hex}}"                          # the committed file's node identity
NODE_IDENTITY = re.compile(rf"^{NODE_AGENT}_[0-9a-f]{{32}}$")
DEAD_LETTER_STREAM = "TESSERA_DEADLETTER"   # shared.streams (not imported: it needs nats-py)
DEAD_LETTER_PREFIX = "deadletter"
JS = "$JS.API"


def all_streams() -> list[str]:
    return [*(stream_name(s) for s in SERVICES), DEAD_LETTER_STREAM]


def _stream_reads(stream: str) -> list[str]:
    """What reading ``stream`` with ephemeral ordered consumers takes (no durable, no acknowledgement)."""
    return [f"{JS}.STREAM.INFO.{stream}", f"{JS}.STREAM.MSG.GET.{stream}", f"{JS}.DIRECT.GET.{stream}",
            f"{JS}.CONSUMER.CREATE.{stream}", f"$JS.FC.{stream}.>"]


def consumer_subjects(stream: str, durable: str, filter_subject: str) -> list[str]:
    """The JetStream API subjects one durable pull consumer needs (nats-py ``pull_subscribe`` with ``durable``
    and ``stream``: info, then create by name with the filter in the subject, then next-message requests),
    and its acknowledgements (``$JS.ACK.<stream>.<durable>.<delivered>.<seqs>.<time>.<pending>``)."""
    return [f"{JS}.CONSUMER.INFO.{stream}.{durable}", f"{JS}.CONSUMER.CREATE.{stream}.{durable}.{filter_subject}",
            f"{JS}.CONSUMER.MSG.NEXT.{stream}.{durable}", f"$JS.ACK.{stream}.{durable}.>"]


def service_permissions(catalog: Catalog, service: str) -> dict[str, Any]:
    contract: ServiceContract = catalog.contracts[service]
    own = contract.stream
    publish: set[str] = {f"{JS}.INFO", f"{DEAD_LETTER_PREFIX}.{service}.>"}
    subscribe: set[str] = {inbox_prefix(service) + ".>"}
    for stream in (own, DEAD_LETTER_STREAM):
        publish |= {f"{JS}.STREAM.INFO.{stream}", f"{JS}.STREAM.CREATE.{stream}", f"{JS}.STREAM.UPDATE.{stream}"}
    for msg in contract.messages:                       # what it owns: it emits its events, answers its requests
        if msg.kind == "request":
            subscribe.add(msg.wildcard())
        elif msg.kind == "event":
            publish.add(msg.wildcard())
    for type_ in contract.sends:                        # others' commands and requests
        publish.add(catalog.message(type_).wildcard())
    for type_ in contract.receives:
        msg, stream = catalog.message(type_), catalog.owner(type_).stream
        subscribe.add(msg.wildcard())
        if msg.live:   # never stored: heard through a plain subscription (Runtime.listen), no durable
            continue
        durable = durable_name(service, type_)
        publish.update({f"{JS}.STREAM.INFO.{stream}", f"{JS}.STREAM.CREATE.{stream}"})   # created if missing
        publish.update(consumer_subjects(stream, durable, msg.wildcard()))
    if service == "gateway":                            # the operators' live feed and dead-letter page
        for stream in all_streams():
            publish.update(_stream_reads(stream))
    answers = any(m.kind == "request" for m in contract.messages)
    return _permissions(publish, subscribe, allow_responses=answers)


def _on_node(msg: Message, node_id: str) -> str:
    """``msg``'s subject on one node (its ``{node_id}``), any other parameter a wildcard."""
    return re.sub(r"\{(\w+)\}", lambda m: node_id if m.group(1) == "node_id" else "*", msg.subject)


def node_permissions(catalog: Catalog, node_id: str, identity: str | None = None) -> dict[str, Any]:
    """The permissions of the node-agent of ``node_id`` (``identity``: its name, by default
    ``node_identity(node_id)``; the template passes placeholders for both): the node-agent's contract with every
    ``{node_id}`` its own."""
    identity = identity or node_identity(node_id)
    contract: ServiceContract = catalog.contracts[NODE_AGENT]
    publish: set[str] = {f"{JS}.INFO"}
    subscribe: set[str] = {inbox_prefix(identity) + ".>"}
    for stream in (contract.stream, DEAD_LETTER_STREAM):
        publish |= {f"{JS}.STREAM.INFO.{stream}", f"{JS}.STREAM.CREATE.{stream}", f"{JS}.STREAM.UPDATE.{stream}"}
    for msg in contract.messages:
        if msg.kind == "request":
            subscribe.add(_on_node(msg, node_id))
        elif msg.kind == "event":
            publish.add(_on_node(msg, node_id))
    for type_ in contract.sends:                        # on its own node's subject (report_topology)
        publish.add(_on_node(catalog.message(type_), node_id))
    for type_ in contract.receives:
        msg, stream = catalog.message(type_), catalog.owner(type_).stream
        durable = f"{identity}__{node_durable_suffix(type_)}"
        subscribe.add(_on_node(msg, node_id))
        publish.update({f"{JS}.STREAM.INFO.{stream}", f"{JS}.STREAM.CREATE.{stream}",
                        f"{DEAD_LETTER_PREFIX}.{NODE_AGENT}.{durable}"})
        publish.update(consumer_subjects(stream, durable, _on_node(msg, node_id)))
    answers = any(m.kind == "request" for m in contract.messages)
    return _permissions(publish, subscribe, allow_responses=answers)


def node_template(catalog: Catalog) -> dict[str, Any]:
    return node_permissions(catalog, "{node_id}", NODE_TEMPLATE)


def identity_permissions(identity: str, catalog: Catalog | None = None) -> dict[str, Any] | None:
    """The permissions of any identity: a service, a node-agent (``node_agent_<hex>``), ``ops`` or ``admin`` (None)."""
    catalog = catalog or load_catalog()
    if NODE_IDENTITY.match(identity):
        node_id = str(uuid.UUID(hex=identity.rsplit("_", 1)[1]))
        return node_permissions(catalog, node_id, identity)
    if identity in SERVICE_IDENTITIES:
        return service_permissions(catalog, identity)
    if identity == OPS:
        return ops_permissions()
    if identity == ADMIN:
        return None
    raise KeyError(f"no NATS identity {identity!r}")


def ops_permissions() -> dict[str, Any]:
    publish = {f"{JS}.INFO", f"{JS}.STREAM.NAMES", f"{JS}.STREAM.LIST"}
    for stream in all_streams():
        publish.update(_stream_reads(stream))
        publish.update({f"{JS}.DIRECT.GET.{stream}.>", f"{JS}.CONSUMER.INFO.{stream}.*",
                        f"{JS}.CONSUMER.NAMES.{stream}", f"{JS}.CONSUMER.LIST.{stream}"})
    subscribe = {inbox_prefix(OPS) + ".>", *(f"{s}.evt.>" for s in SERVICES)}
    return _permissions(publish, subscribe, allow_responses=False)


def _permissions(publish: set[str], subscribe: set[str], *, allow_responses: bool) -> dict[str, Any]:
    return {"publish": {"allow": sorted(publish)}, "subscribe": {"allow": sorted(subscribe)},
            "allow_responses": allow_responses}


def permissions(catalog: Catalog | None = None) -> dict[str, dict[str, Any] | None]:
    """Identity -> its permissions (publish/subscribe allow lists, allow_responses); ``admin`` -> None
    (no permissions block: everything); ``node_agent_{node_hex}`` -> the template of every node's."""
    catalog = catalog or load_catalog()
    result: dict[str, dict[str, Any] | None] = {s: service_permissions(catalog, s) for s in SERVICE_IDENTITIES}
    result[NODE_TEMPLATE] = node_template(catalog)
    result[OPS] = ops_permissions()
    result[ADMIN] = None
    return result


def document(catalog: Catalog | None = None) -> dict[str, Any]:
    return {
        "description": "NATS permissions of every identity, generated from the contract catalog by "
                       "`python -m tooling.bus_permissions` (do not edit). admin: null means no restriction.",
        "inbox_prefixes": {i: inbox_prefix(i) for i in (*IDENTITIES, NODE_TEMPLATE)},
        "identities": permissions(catalog),
    }


def render(catalog: Catalog | None = None) -> str:
    return json.dumps(document(catalog), indent=2, sort_keys=True) + "\n"


def server_users(public_keys: dict[str, str], catalog: Catalog | None = None) -> list[dict[str, Any]]:
    """The ``authorization.users`` entries of the server configuration: one per identity in ``public_keys``
    (identity -> nkey public key: services, ``ops``, ``admin``, node-agents), each with its permissions (none
    for ``admin``); the fixed identities first, then the nodes' in order."""
    catalog = catalog or load_catalog()
    order = [i for i in IDENTITIES if i in public_keys] + sorted(i for i in public_keys if i not in IDENTITIES)
    users = []
    for identity in order:
        perms = identity_permissions(identity, catalog)
        user: dict[str, Any] = {"nkey": public_keys[identity]}
        if perms is not None:
            user["permissions"] = {k: v for k, v in perms.items() if v is not False}
        users.append(user)
    return users


def authorization_block(public_keys: dict[str, str], catalog: Catalog | None = None) -> str:
    """The server configuration's ``authorization`` block (JSON values: the configuration format accepts them,
    and quoted strings keep ``$JS`` from reading as a variable). No ``no_auth_user``: a connection without
    credentials is refused."""
    return "authorization " + json.dumps({"users": server_users(public_keys, catalog)}, indent=2, sort_keys=True) + "\n"


def differences(path: Path = DEFAULT_FILE, catalog: Catalog | None = None) -> list[str]:
    """What differs between the committed file and the generated one ([] = none)."""
    if not path.exists():
        return [f"{path}: missing"]
    diff = text_diff(path.read_text(), render(catalog), str(path), most=80, context=1)
    return ["\n".join(diff)] if diff else []


def write(path: Path = DEFAULT_FILE, catalog: Catalog | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(catalog))
    return path


def main(argv: list[str] | None = None) -> int:
    return check_or_write(argv, module="tooling.bus_permissions", description=__doc__.splitlines()[0], option="file",
                          default=DEFAULT_FILE, what="where the permissions live", differences=differences,
                          write=lambda path: [write(path)], stale="{path} is out of date", fresh="{path} is up to date.")


if __name__ == "__main__":
    sys.exit(main())
