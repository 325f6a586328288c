"""Scheduler's handlers: onboarding, catalog (shapes, pools, quotas), reservations, and the in-memory index
they share (active.py). bootstrap.py wires them; nothing here connects."""
from .active import ActiveScheduler
from .burn_in import burn_in_finished, run_burn_in, slot_rewiped
from .catalog import define_pool, define_shape, set_quota
from .common import refused
from .gangs import cancel_gang, refused_gang, reserve_gang
from .onboarding import approve_slot_map, register_node, report_topology, update_node
from .reservations import cancel_request, release_slots, reserve_slots

__all__ = [
           "ActiveScheduler",
           "approve_slot_map",
           "burn_in_finished",
           "cancel_gang",
           "cancel_request",
           "define_pool",
           "define_shape",
           "register_node",
           "release_slots",
           "report_topology",
           "refused",
           "refused_gang",
           "reserve_gang",
           "reserve_slots",
           "run_burn_in",
           "slot_rewiped",
           "set_quota",
           "update_node",
]
