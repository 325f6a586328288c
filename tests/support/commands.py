"""Step commands as the saga sends them, built the way several test modules need them (the payloads
only: publish them with tests.support.bus)."""
from __future__ import annotations

import uuid

from shared.wire import step_key


def attach_cmd(alloc: uuid.UUID, tenant: uuid.UUID, saga: uuid.UUID | None = None) -> dict:
    """network.attach_network for an allocation (on the tenant's default network, a random node)."""
    saga = saga or uuid.uuid4()
    return {"saga_id": saga, "step": "attach_network", "idempotency_key": step_key(saga, "attach_network"),
            "allocation_id": alloc, "tenant_id": tenant, "node_id": uuid.uuid4()}


def detach_cmd(alloc: uuid.UUID, tenant: uuid.UUID, saga: uuid.UUID, compensates: str | None = None) -> dict:
    """network.detach_network (an undo of the attach when ``compensates`` names its key)."""
    return {"saga_id": saga, "step": "detach_network", "idempotency_key": step_key(saga, "detach_network"),
            "allocation_id": alloc, "tenant_id": tenant, "compensates": compensates}


def provision_node_cmd(node_id, alloc, saga, *, slots=(0, 1), labels=None) -> dict:
    """node_agent.provision of an allocation's instance on ``node_id``."""
    return {"saga_id": saga, "step": "provision_node", "idempotency_key": step_key(saga, "provision_node"),
            "allocation_id": alloc, "tenant_id": uuid.uuid4(), "node_id": node_id, "slots": list(slots),
            "labels": labels or {}}


def deprovision_node_cmd(node_id, alloc, saga, *, compensates: str | None = None) -> dict:
    """node_agent.deprovision (an undo of the provision when ``compensates`` names its key)."""
    return {"saga_id": saga, "step": "deprovision_node", "idempotency_key": step_key(saga, "deprovision_node"),
            "allocation_id": alloc, "tenant_id": uuid.uuid4(), "node_id": node_id, "compensates": compensates}
