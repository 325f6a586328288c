"""Invoices: every ledger entry billed on exactly one invoice (STUB: filled in by the invoices work)."""
from __future__ import annotations

import uuid
from dataclasses import dataclass

from shared.runtime import Runtime
from shared.unit_of_work import UnitOfWork

from .. import contracts as c
from ..domain.usage import Rating, UsageRecord
from ..settings import BillingSettings


@dataclass(frozen=True)
class Billed:
    invoice_id: uuid.UUID | None
    correction: bool = False


async def assign(ctx: UnitOfWork, record: UsageRecord, rating: Rating, ledger_seq: int) -> Billed:
    """Bill the ledger entry ``ledger_seq`` (``record`` rated as ``rating``) on its invoice, in the caller's
    transaction; returns the invoice and whether it is a correction of a finalized period."""
    return Billed(None)


async def invoices_forever(rt: Runtime, config: BillingSettings) -> None:
    """Publish changed invoices and finalize due ones every ``config.invoice_tick_s`` (until cancelled)."""
    return None


async def verify_ledger(rt: Runtime, req: c.VerifyLedger) -> c.LedgerVerification:
    raise NotImplementedError
