"""Where a namespace slot lives: the names the node-agent gives a node and an allocation's network namespace, which
the services that run work in a slot (a tenant cluster's daemons) must find. Pure, deterministic."""
from __future__ import annotations

import uuid


def node_tag(node_id: uuid.UUID) -> str:
    """The node's tag in the names of its kernel objects (several nodes may share one kernel: tests, benchmarks)."""
    return node_id.hex[:8]


def slot_netns(tag: str, attachment_id: uuid.UUID) -> str:
    """The network namespace of a slot's attachment on the node tagged ``tag``."""
    return f"ts-{tag}-{attachment_id.hex[:12]}"
