"""Billing's periodic work: ledger checkpoints, meter cuts, the invoice tick, webhook deliveries, and forgetting
stops whose activation never came.

Each runs on the leader only (the kit's leadership ``billing``, shared.periodic): one replica at a time, and a
standby takes over when it dies. Each would stay correct on several replicas at once (a checkpoint of the same
size is stored once, a cut at the same instant records nothing, invoices and deliveries are claimed under row
locks), but every replica would do the same work and wait on the same locks.
"""
from __future__ import annotations

from functools import partial

from shared.runtime import Runtime

from ..handlers import activations, budgets, invoices, meters, rating
from ..settings import BillingSettings


def wire(rt: Runtime, config: BillingSettings) -> None:
    """Register the periodic steps (a period of 0 turns checkpoints, or cuts, off)."""
    if config.checkpoint_s > 0:
        rt.every(config.checkpoint_s, partial(rating.checkpoint, rt), leader="billing")
    if config.cut_s > 0:
        rt.every(config.cut_s, partial(meters.cut, rt, grace_s=config.invoice_grace_s), leader="billing")
    rt.every(config.invoice_tick_s, partial(invoices.tick, rt), leader="billing")
    rt.every(config.webhook_tick_s, partial(budgets.deliver_due, rt, config=config), leader="billing")
    rt.every(activations.FORGET_EVERY_S, partial(activations.forget_stale_stops, rt), leader="billing")
