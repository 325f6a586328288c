"""Billing's subscribers and answers: wire message → handler, nothing else (its periodic work: loops.py)."""
from __future__ import annotations

from functools import partial

from shared.runtime import Runtime

from .. import handlers
from ..contracts import START_METER
from ..handlers import activations, budgets, invoices, rating
from ..settings import BillingSettings


def wire(rt: Runtime, config: BillingSettings) -> None:
    grace = config.invoice_grace_s      # every path that rates usage bills it on an invoice
    rt.consumers.participate(START_METER, invoke=partial(handlers.start_meter, sim_faults=rt.settings.sim_faults),
                             undo=partial(handlers.stop_meter, grace_s=grace))
    rt.consumers.subscribe("allocation.activated", partial(activations.on_activated, grace_s=grace))
    rt.consumers.subscribe("allocation.failed", partial(activations.on_failed, grace_s=grace))
    rt.consumers.subscribe("billing.publish_price_list", handlers.publish_price_list)
    rt.consumers.subscribe("billing.set_budget", budgets.set_budget)
    rt.consumers.subscribe("billing.delete_budget", budgets.delete_budget)
    rt.consumers.subscribe("storage.volume_changed", rating.on_volume_changed)
    rt.consumers.subscribe("storage.usage_reported", partial(rating.on_usage_reported, grace_s=grace))
    rt.answer("billing.verify_ledger", partial(invoices.verify_ledger, rt))
