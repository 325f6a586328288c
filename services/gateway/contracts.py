"""Wire contract of the gateway: the audit events it emits, what it sends and what it projects."""
from __future__ import annotations

import uuid
from datetime import datetime

from pydantic import Field

from services.node_agent.contracts import PowerAction
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


class PowerActionExpired(Wire):
    """The gateway gave up on a power action: no answer from its node by the command's deadline plus a grace.
    The node refuses the command should it get it later; an answer it sent before still counts if it comes
    (the action then shows it)."""

    request_id: uuid.UUID = Field(description="The action's id (node_agent.power's request_id).")
    allocation_id: uuid.UUID
    tenant_id: uuid.UUID
    node_id: uuid.UUID
    action: PowerAction
    requested_by: uuid.UUID
    expires_at: datetime
    reason: str = Field(max_length=2000)
    at: datetime


class PolicyChanged(Wire):
    """A policy was created, replaced (a new version) or deleted: every gateway replica drops its cached policy
    set (they listen on the subject directly, each replica, not as one durable consumer)."""
    policy_id: str = Field(max_length=128)
    scope: str = Field(pattern=r"^(provider|tenant)$", examples=["tenant"])
    tenant_id: uuid.UUID | None = None
    version: int
    change: str = Field(pattern=r"^(created|updated|deleted)$", examples=["created"])
    by: uuid.UUID
    at: datetime


class CredentialRevoked(Wire):
    """An API key was revoked, or a user disabled, or a token signing key retired: every gateway replica drops its
    cached revocation list, so tokens already issued stop working at once."""
    kind: str = Field(pattern=r"^(api_key|user|signing_key)$", examples=["api_key"])
    key_id: str | None = Field(default=None, max_length=128, description="The API key's id or the signing key's kid.")
    user_id: uuid.UUID | None = None
    tenant_id: uuid.UUID | None = None
    by: uuid.UUID | None = None
    at: datetime


CONTRACT = ServiceContract(
    service="gateway",
    title="Tessera API gateway",
    description=(
        "The only HTTP entry for tenants and provider admins; records identity changes and projects allocation events for reads; "
        "sends tenants' power actions to the nodes and reads their consoles live; registers nodes' BMCs (passwords sealed), "
        "checks them live, shows the wipe evidence of released slots and re-wipes quarantined ones; sends tenants' volume and "
        "storage quota requests to the storage service and projects its volumes, quotas, classes and usage; "
        "shows nodes' health, drains nodes, sets the health policy, closes breakers and injects faults into simulated nodes; "
        "sends tenants' cluster and job requests to the paas service, projects its clusters and jobs and reads jobs' output live."
    ),
    messages=[
        Message("gateway.tenant_created", "gateway.evt.tenant_created", TenantCreated, "event",
                "A provider admin created a tenant (audit)."),
        Message("gateway.user_created", "gateway.evt.user_created", UserCreated, "event", "A user was created (audit)."),
        Message("gateway.policy_changed", "gateway.evt.policy_changed", PolicyChanged, "event",
                "A provider or tenant policy was created, replaced or deleted (replicas drop their cached policies)."),
        Message("gateway.credential_revoked", "gateway.evt.credential_revoked", CredentialRevoked, "event",
                "An API key was revoked, a user disabled or a signing key retired (replicas drop their cached revocation list)."),
        Message("gateway.power_action_expired", "gateway.evt.power_action_expired", PowerActionExpired, "event",
                "No node answered a power action by its deadline (plus a grace): the action failed."),
    ],
    receives=[
        "allocation.requested", "allocation.activated", "allocation.release_requested",
        "allocation.released", "allocation.failed", "allocation.command_rejected", "allocation.interrupted",
        "allocation.rescheduled", "scheduler.node_registered", "saga.step_changed", "saga.allocation_waiting",
        "saga.allocation_left_line",
        "scheduler.node_changed", "scheduler.shape_changed", "scheduler.pool_changed", "scheduler.quota_changed",
        "scheduler.quota_use_changed", "scheduler.admin_command_rejected", "scheduler.reservation_queued",
        "scheduler.slots_reserved",
        "scheduler.slots_released", "scheduler.slot_reservation_failed", "scheduler.preemption_notice",
        "scheduler.node_health_changed", "scheduler.health_policy_changed", "scheduler.breaker_changed",
        "network.network_created", "network.network_deleted", "network.security_rule_added",
        "network.security_rule_removed", "network.command_rejected", "network.network_attached",
        "network.network_detached", "network.port_moved", "node_agent.power_changed", "node_agent.instance_problem",
        "node_agent.slots_wiped", "node_agent.slot_rewiped", "node_agent.fault_injected",
        "storage.volume_changed", "storage.quota_changed", "storage.classes_announced", "storage.usage_reported",
        "billing.price_list_published", "billing.price_list_rejected", "billing.usage_rated",
        "billing.invoice_changed", "billing.budget_changed", "billing.budget_threshold_crossed",
        "billing.webhook_delivery_changed", "paas.cluster_changed", "paas.job_changed",
        "paas.spot_offering_changed",
        "gateway.policy_changed", "gateway.credential_revoked",   # its own, heard by every replica (Runtime.listen)
    ],
    sends=["allocation.request", "allocation.release", "scheduler.register_node",
           "scheduler.approve_slot_map", "scheduler.update_node", "scheduler.define_shape", "scheduler.define_pool",
           "scheduler.set_quota", "scheduler.cancel_request", "saga.withdraw",
           "network.create_network", "network.delete_network", "network.add_security_rule",
           "network.remove_security_rule", "node_agent.power", "node_agent.read_console", "node_agent.set_bmc",
           "node_agent.validate_bmc", "node_agent.rewipe", "scheduler.run_burn_in",
           "storage.create_volume", "storage.resize_volume", "storage.destroy_volume", "storage.attach_volume",
           "storage.detach_volume", "storage.set_quota", "billing.publish_price_list", "billing.set_budget",
           "billing.delete_budget", "billing.verify_ledger", "scheduler.drain_node", "scheduler.set_health_policy",
           "scheduler.close_breaker", "node_agent.inject_fault", "saga.read_steps",
           "paas.create_cluster", "paas.scale_cluster", "paas.delete_cluster", "paas.submit_job", "paas.cancel_job",
           "paas.set_spot_offering",
           "paas.job_logs"],
)
