"""Billing's subscribers, answers and loops: wire message → handler, nothing else."""
from __future__ import annotations

from functools import partial

from shared.runtime import Runtime

from .. import handlers
from ..contracts import START_METER
from ..handlers import budgets, invoices, meters, rating
from ..settings import BillingSettings


def wire(rt: Runtime, config: BillingSettings) -> None:
    grace = config.invoice_grace_s      # every path that rates usage bills it on an invoice
    rt.consumers.participate(START_METER, invoke=partial(handlers.start_meter, sim_faults=rt.settings.sim_faults),
                             undo=partial(handlers.stop_meter, grace_s=grace))
    rt.consumers.subscribe("billing.publish_price_list", handlers.publish_price_list)
    rt.consumers.subscribe("billing.set_budget", budgets.set_budget)
    rt.consumers.subscribe("billing.delete_budget", budgets.delete_budget)
    rt.consumers.subscribe("storage.volume_changed", rating.on_volume_changed)
    rt.consumers.subscribe("storage.usage_reported", partial(rating.on_usage_reported, grace_s=grace))
    rt.answer("billing.verify_ledger", partial(invoices.verify_ledger, rt))
    if config.checkpoint_s > 0:   # each replica may: a checkpoint of the same size is stored once
        rt.every(config.checkpoint_s, partial(rating.checkpoint, rt))
    if config.cut_s > 0:
        rt.every(config.cut_s, partial(meters.cut, rt, grace_s=grace))
    rt.every(config.invoice_tick_s, partial(invoices.tick, rt))
    rt.every(config.webhook_tick_s, partial(budgets.deliver_due, rt, config=config))
