"""The gateway's subscribers: which event goes to which projection (one durable consumer per message type)."""
from __future__ import annotations

from shared.runtime import Runtime

from ..api.allocations import interruption_projection as interruptions
from ..api.allocations import power_projection as instances
from ..api.allocations import projection as allocations
from ..api.billing import budget_projection as budgets
from ..api.billing import invoice_projection as invoices
from ..api.billing import usage_projection as billing
from ..api.clusters import projection as clusters
from ..api.inventory import health_projection as health
from ..api.inventory import projection as inventory
from ..api.inventory import rejections_projection as rejections
from ..api.inventory import wipe_projection as wipes
from ..api.jobs import projection as jobs
from ..api.networks import projection as networks
from ..api.spot import projection as spot
from ..api.storage import projection as volumes


def wire(rt: Runtime) -> None:
    subscribe = rt.consumers.subscribe
    subscribe("allocation.requested", allocations.on_requested)
    subscribe("allocation.activated", allocations.on_activated)
    subscribe("allocation.release_requested", allocations.on_release_requested)
    subscribe("allocation.released", allocations.on_released)
    subscribe("allocation.failed", allocations.on_failed)
    subscribe("allocation.command_rejected", allocations.on_command_rejected)
    subscribe("allocation.interrupted", interruptions.on_interrupted)
    subscribe("allocation.rescheduled", interruptions.on_rescheduled)
    subscribe("saga.step_changed", allocations.on_saga_step_changed)
    subscribe("saga.allocation_waiting", allocations.on_allocation_waiting)
    subscribe("saga.allocation_left_line", allocations.on_allocation_left_line)
    subscribe("scheduler.node_registered", inventory.on_node_registered)
    subscribe("scheduler.node_changed", inventory.on_node_changed)
    subscribe("scheduler.shape_changed", inventory.on_shape_changed)
    subscribe("scheduler.pool_changed", inventory.on_pool_changed)
    subscribe("scheduler.quota_changed", inventory.on_quota_changed)
    subscribe("scheduler.quota_use_changed", inventory.on_quota_use_changed)
    subscribe("scheduler.admin_command_rejected", rejections.on_admin_command_rejected)
    subscribe("scheduler.reservation_queued", allocations.on_reservation_queued)
    subscribe("scheduler.slots_reserved", allocations.on_slots_reserved)
    subscribe("scheduler.slots_released", inventory.on_slots_released)
    subscribe("scheduler.slot_reservation_failed", allocations.on_slot_reservation_failed)
    subscribe("scheduler.preemption_notice", allocations.on_preemption_notice)
    subscribe("scheduler.node_health_changed", health.on_node_health_changed)
    subscribe("scheduler.health_policy_changed", health.on_health_policy_changed)
    subscribe("scheduler.breaker_changed", health.on_breaker_changed)
    subscribe("network.network_created", networks.on_network_created)
    subscribe("network.network_deleted", networks.on_network_deleted)
    subscribe("network.security_rule_added", networks.on_rule_added)
    subscribe("network.security_rule_removed", networks.on_rule_removed)
    subscribe("network.command_rejected", networks.on_command_rejected)
    subscribe("network.network_attached", networks.on_network_attached)
    subscribe("network.network_detached", networks.on_network_detached)
    subscribe("network.port_moved", instances.on_port_moved)
    subscribe("node_agent.power_changed", instances.on_power_changed)
    subscribe("node_agent.instance_problem", instances.on_instance_problem)
    subscribe("node_agent.slots_wiped", wipes.on_slots_wiped)        # every node's (the subject's wildcard)
    subscribe("node_agent.slot_rewiped", wipes.on_slot_rewiped)
    subscribe("node_agent.fault_injected", health.on_fault_injected)   # every node's (the subject's wildcard)
    subscribe("storage.volume_changed", volumes.on_volume_changed)
    subscribe("storage.quota_changed", volumes.on_quota_changed)
    subscribe("storage.classes_announced", volumes.on_classes_announced)
    subscribe("storage.usage_reported", volumes.on_usage_reported)
    subscribe("billing.price_list_published", billing.on_price_list_published)
    subscribe("billing.price_list_rejected", billing.on_price_list_rejected)
    subscribe("billing.usage_rated", billing.on_usage_rated)
    subscribe("billing.invoice_changed", invoices.on_invoice_changed)
    subscribe("billing.budget_changed", budgets.on_budget_changed)
    subscribe("billing.budget_threshold_crossed", budgets.on_threshold_crossed)
    subscribe("billing.webhook_delivery_changed", budgets.on_webhook_delivery_changed)
    subscribe("paas.cluster_changed", clusters.on_cluster_changed)
    subscribe("paas.spot_offering_changed", spot.on_spot_offering_changed)
    subscribe("paas.job_changed", jobs.on_job_changed)
