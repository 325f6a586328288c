"""Billing's own settings (the kit's ``ServiceSettings`` are read beside them), built once in bootstrap.

A value that is not a number in range raises SettingError naming the variable.
"""
from __future__ import annotations

from dataclasses import dataclass

from shared.settings import flag, integer, number, setting


@dataclass(frozen=True)
class BillingSettings:
    checkpoint_s: float = setting("TESSERA_BILLING_CHECKPOINT_S", 300.0, number(0),
                                  doc="seconds between two Merkle checkpoints of the ledger (stored, and published "
                                      "as billing.ledger_checkpointed); 0: none")
    cut_s: float = setting("TESSERA_BILLING_CUT_S", 300.0, number(0),
                           doc="seconds between two cuts of the running meters into usage records (and the hourly "
                               "rollups they update); 0: usage is recorded when a meter stops")
    invoice_grace_s: int = setting("TESSERA_BILLING_INVOICE_GRACE_S", 3 * 86400, integer(0),
                                   doc="seconds after its period ends that an invoice stays draft (late usage still "
                                       "lands on it); then it is finalized and never changes")
    invoice_tick_s: float = setting("TESSERA_BILLING_INVOICE_TICK_S", 5.0, number(positive=True),
                                    doc="seconds between two passes that publish changed invoices and finalize due ones")
    webhook_tick_s: float = setting("TESSERA_BILLING_WEBHOOK_TICK_S", 1.0, number(positive=True),
                                    doc="seconds between two passes over the webhook calls due")
    webhook_attempts: int = setting("TESSERA_BILLING_WEBHOOK_ATTEMPTS", 8, integer(1, 100),
                                    doc="attempts of a webhook call before it is marked failed")
    webhook_backoff_s: float = setting("TESSERA_BILLING_WEBHOOK_BACKOFF_S", 2.0, number(positive=True),
                                       doc="seconds before the first retry of a webhook call; doubled each retry "
                                           "(capped at one hour)")
    webhook_timeout_s: float = setting("TESSERA_BILLING_WEBHOOK_TIMEOUT_S", 10.0, number(positive=True),
                                       doc="seconds a webhook call may take")
    webhook_allow_private: bool = setting("TESSERA_BILLING_WEBHOOK_ALLOW_PRIVATE", False, flag,
                                          doc="also call webhooks whose host is a loopback, private, link-local or "
                                              "reserved address (a lab, a test); off: public addresses only")
