"""Who a process is on the bus: its NATS identity (an nkey, whose seed file the process holds) and the prefix of
its inboxes.

Each identity's inboxes (request replies, JetStream API answers, pull-consumer deliveries) live under
``_INBOX_<identity>.>``, and its permissions (``tooling.bus_permissions``) let it subscribe there and nowhere
else under an inbox: one identity cannot read another's replies or deliveries.
"""
from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

NODE_AGENT = "node_agent"
# durables of a node-agent whose name is not the received message's name (kept: renaming a durable orphans it)
_NODE_DURABLE_NAMES = {"network.tenant_networks_changed": "tenant_networks"}


def inbox_prefix(identity: str) -> str:
    return f"_INBOX_{identity}"


def node_identity(node_id: uuid.UUID | str) -> str:
    """The identity (and durable prefix) of the node-agent of ``node_id``: file-name and subject-token safe."""
    return f"{NODE_AGENT}_{uuid.UUID(str(node_id)).hex}"


def identity(service: str, instance: str = "0") -> str:
    """The identity a process of ``service`` connects as: the service's, or for a node-agent its node's
    (``instance`` is the node id)."""
    if service == NODE_AGENT:
        try:
            return node_identity(instance)
        except ValueError:
            return service   # no node id: the node-agent refuses to start anyway
    return service


def publish_scope(service: str, instance: str = "0") -> tuple[str, str] | None:
    """What a process may publish of its outbox's rows, when that is less than all of them: for a node-agent
    (``prefix``, ``suffix``) = (``""``, ``.<node id>``), the rows of its own node only, whatever service the subject
    belongs to (its events, and the commands it sends on its node's subject, such as
    ``scheduler.cmd.report_topology.<node id>``: every subject a node-agent publishes ends with its node id).
    None: no limit.

    Every node-agent writes to the same outbox table (one schema for the service); its relay must publish only
    its own node's rows, which the server would refuse from any other node (``shared.outbox.OutboxRelay``)."""
    if identity(service, instance) == service:
        return None
    return "", f".{uuid.UUID(str(instance))}"


def node_durable_suffix(type_: str) -> str:
    """What follows ``<node identity>__`` in the name of the durable through which a node-agent receives ``type_``."""
    return _NODE_DURABLE_NAMES.get(type_, type_.split(".", 1)[1])


def node_durable(node_id: uuid.UUID | str, type_: str) -> str:
    """The durable consumer through which the node-agent of ``node_id`` receives ``type_``
    (``node_agent_<hex>__<name>``)."""
    return f"{node_identity(node_id)}__{node_durable_suffix(type_)}"


def connect_options(identity: str, seed_file: str | Path | None) -> dict[str, Any]:
    """Keyword arguments for ``nats.connect`` as ``identity``, signing with the nkey seed in ``seed_file``
    (None: no credentials, for a server without authorization)."""
    options: dict[str, Any] = {"inbox_prefix": inbox_prefix(identity)}
    if seed_file is not None:
        options["nkeys_seed"] = str(seed_file)
    return options
