"""Wire contract of the gateway: the audit events it emits, what it sends and what it projects."""
from __future__ import annotations

import uuid

from shared.contract import Message, ServiceContract
from shared.wire import Wire


class TenantCreated(Wire):
    tenant_id: uuid.UUID
    name: str
    created_by: uuid.UUID


class UserCreated(Wire):
    user_id: uuid.UUID
    tenant_id: uuid.UUID | None
    name: str
    role: str
    created_by: uuid.UUID


CONTRACT = ServiceContract(
    service="gateway",
    title="Tessera API gateway",
    description="The only HTTP entry for tenants and provider admins; records identity changes and projects allocation events for reads.",
    messages=[
        Message("gateway.tenant_created", "gateway.evt.tenant_created", TenantCreated, "event", "A provider admin created a tenant (audit)."),
        Message("gateway.user_created", "gateway.evt.user_created", UserCreated, "event", "A user was created (audit)."),
    ],
    receives=[
        "allocation.requested", "allocation.provisioning", "allocation.activated", "allocation.release_requested",
        "allocation.released", "allocation.failed", "allocation.command_rejected",
        "scheduler.node_registered", "saga.step_changed",
    ],
    sends=["allocation.request", "allocation.release", "scheduler.register_node"],
)
