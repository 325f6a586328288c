"""Invoices: every ledger entry billed on exactly one invoice; drafts published as they change, finalized
once their grace period ends; the ledger verified on request. Rules: services/billing/domain/invoices.py.

``assign`` runs in the rating transaction that appends the entry (handlers/rating.rate_and_record), so an entry
and its billing commit together: the invariant "an invoice's lines sum to its ledger entries" holds at every
commit. ``tick`` finalizes due drafts and publishes changed invoices through the outbox; each replica may run
it (rows are taken ``FOR UPDATE SKIP LOCKED``). A finalized invoice is hashed, stamped and published in one
transaction and never changes (schema/0004_invoices.sql refuses it).
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import asyncpg
import structlog

from shared.envelope import utcnow
from shared.runtime import Runtime
from shared.unit_of_work import UnitOfWork

from .. import contracts as c
from ..adapters import invoices as repo
from ..adapters.ledger import PgLedger
from ..adapters.metrics import INVOICES
from ..domain import invoices as rules
from ..domain.usage import Rating, UsageRecord
from ..settings import BillingSettings

log = structlog.get_logger()
BATCH = 50          # invoices per tick transaction (a rating transaction may wait on one of them)
ATTEMPTS = 5        # an invoice finalized between choosing it and locking it: choose again


@dataclass(frozen=True)
class Billed:
    invoice_id: uuid.UUID | None
    correction: bool = False


@dataclass
class Ticked:
    finalized: list[uuid.UUID] = field(default_factory=list)
    published: list[uuid.UUID] = field(default_factory=list)


DEFAULT_GRACE_S = BillingSettings.invoice_grace_s      # TESSERA_BILLING_INVOICE_GRACE_S unless the wiring says


async def assign(ctx: UnitOfWork, record: UsageRecord, rating: Rating, ledger_seq: int, *,
                 now: datetime | None = None, grace_s: int | None = None) -> Billed:
    """``assign_many`` of one entry."""
    [billed] = await assign_many(ctx, [(record, rating, ledger_seq)], now=now, grace_s=grace_s)
    return billed


async def assign_many(ctx: UnitOfWork, entries: list[tuple[UsageRecord, Rating, int]], *,
                      now: datetime | None = None, grace_s: int | None = None) -> list[Billed]:
    """Bill each ledger entry (``record`` rated as ``rating``, ledger seq) on its invoice, in the caller's
    transaction; returns, in order, each one's invoice and whether it is a correction of a finalized period.
    Idempotent: an entry already billed returns its invoice. May wait for a finalizer holding an invoice.
    ``open_invoices`` then ``bill``: a few statements per batch, however many entries and invoices."""
    done = {seq: Billed(*hit) for seq, hit in (await repo.billed_on(ctx.conn, [s for _, _, s in entries])).items()}
    todo = [(r, rating, seq) for r, rating, seq in entries if seq not in done]
    opened = await open_invoices(ctx, [(r, rating) for r, rating, _ in todo], now=now, grace_s=grace_s)
    done.update(zip((seq for _, _, seq in todo), await bill(ctx, opened, [seq for _, _, seq in todo])))
    return [done[seq] for _, _, seq in entries]


@dataclass(frozen=True)
class Opened:
    """Where a rated record is to be billed: its invoice (a draft locked by this transaction) and line."""
    invoice_id: uuid.UUID
    line: rules.LineSpec
    quantity: str
    amount_minor: int
    correction: bool


async def invoice_statuses(ctx: UnitOfWork, records: list[UsageRecord]) -> dict[uuid.UUID, dict[datetime, str]]:
    """The statuses of the invoices these records may go on (tenant → period start → status), read without
    a lock: rating reads them before the ledger's lock and hands them to ``open_invoices``, which looks again
    at any that changed meanwhile."""
    if not records:
        return {}
    since = min(rules.period_of(r.period_start).start for r in records)
    return await repo.statuses(ctx.conn, sorted({r.tenant_id for r in records}), since)


async def open_invoices(ctx: UnitOfWork, rated: list[tuple[UsageRecord, Rating]], *,
                        now: datetime | None = None, grace_s: int | None = None,
                        known: dict[uuid.UUID, dict[datetime, str]] | None = None) -> list[Opened]:
    """The draft invoice and line each rated record goes on, in order, each invoice created if missing and
    locked (``FOR UPDATE``, in one order) until the caller's transaction ends, so none is finalized before
    ``bill`` adds the entries. ``known``: the statuses ``invoice_statuses`` read (else read here); an
    invoice finalized since is found locked and not a draft, and its records look again. Rating calls this
    under the ledger's lock, like every writer of invoice rows that appends to the ledger: one lock order
    (ledger, then invoices) even when one transaction rates several times. May wait for a finalizer
    holding an invoice."""
    conn = ctx.conn
    if not rated:
        return []
    now = now or utcnow()
    grace = timedelta(seconds=DEFAULT_GRACE_S if grace_s is None else grace_s)
    out: dict[int, Opened] = {}
    todo = list(enumerate(rated))
    for _ in range(ATTEMPTS):
        if not todo:
            break
        if known is None:
            known = await invoice_statuses(ctx, [r for _, (r, _) in todo])
        goals = [rules.target(r.period_start, now, grace, known.get(r.tenant_id, {})) for _, (r, _) in todo]
        invoices = await repo.lock_or_create(conn, [(r.tenant_id, g.period) for (_, (r, _)), g in zip(todo, goals)],
                                             grace)
        known = None
        retry = []
        for (i, (r, rating)), goal in zip(todo, goals):
            invoice = invoices[(r.tenant_id, goal.period.start)]
            if invoice["status"] != rules.DRAFT:
                retry.append((i, (r, rating)))      # finalized after we looked: look again
                continue
            line = rules.line_for(kind=r.kind, sku_price_id=rating.sku_price_id, currency=rating.currency,
                                  price_list_version=rating.price_version, corrects=goal.corrects)
            out[i] = Opened(invoice["id"], line, r.quantity_text, rating.amount_minor, goal.correction)
        todo = retry
    if todo:
        raise RuntimeError(f"usage {todo[0][1][0].key}: no open invoice found in {ATTEMPTS} attempts")
    return [out[i] for i in range(len(rated))]


async def bill(ctx: UnitOfWork, opened: list[Opened], ledger_seqs: list[int]) -> list[Billed]:
    """Bill each ledger entry on the invoice ``open_invoices`` chose for it (locked by this transaction);
    returns, in order, each one's invoice. An entry already billed keeps (and returns) its invoice. One
    statement, and one more only when an entry was billed before."""
    if not opened:
        return []
    done: dict[int, Billed] = {}
    billing = []
    for o, seq in zip(opened, ledger_seqs):
        if seq not in done:
            billing.append(repo.Billing(o.invoice_id, o.line, o.quantity, o.amount_minor, seq))
            done[seq] = Billed(o.invoice_id, o.correction)
    billed_now = await repo.add_entries(ctx.conn, billing)
    if before := [seq for seq in done if seq not in billed_now]:
        done.update({seq: Billed(*hit) for seq, hit in (await repo.billed_on(ctx.conn, before)).items()})
    return [done[seq] for seq in ledger_seqs]


async def document(conn: asyncpg.Connection, invoice: asyncpg.Record, *, status: str | None = None) -> c.InvoiceDoc:
    """The invoice as published: its lines, totals and the sum of its ledger entries (read from the ledger)."""
    lines = [c.InvoiceLine(line_key=r["line_key"], description=r["description"], kind=r["kind"],
                           correction=r["correction"], corrects_period=r["corrects_period"],
                           sku_price_id=r["sku_price_id"], price_list_version=r["price_list_version"],
                           unit=r["unit"], quantity=rules.quantity_in_unit(r["kind"], r["usage_quantity"]),
                           amount_minor=r["amount_minor"], currency=r["currency"], entries=r["entries"])
             for r in await repo.lines(conn, invoice["id"])]
    ledger = await repo.ledger_sums(conn, invoice["id"])
    return c.InvoiceDoc(
        invoice_id=invoice["id"], number=invoice["number"], tenant_id=invoice["tenant_id"],
        period_start=invoice["period_start"], period_end=invoice["period_end"], grace_until=invoice["grace_until"],
        status=status or invoice["status"], lines=lines, entries=sum(r["entries"] for r in ledger),
        totals=_amounts(rules.totals((x.currency, x.amount_minor) for x in lines)),
        ledger_sum=_amounts(rules.totals((r["currency"], r["amount_minor"]) for r in ledger)),
        finalized_at=invoice["finalized_at"], content_hash=invoice["content_hash"], version=invoice["version"],
        updated_at=invoice["updated_at"])


def _amounts(pairs: list[tuple[str, int]]) -> list[c.Amount]:
    return [c.Amount(currency=cur, amount_minor=amount) for cur, amount in pairs]


def hash_of(doc: c.InvoiceDoc) -> str:
    return rules.content_hash([x.model_dump(mode="json") for x in doc.lines],
                              [x.model_dump(mode="json") for x in doc.totals])


async def _emit(uow: UnitOfWork, doc: c.InvoiceDoc) -> None:
    await uow.emit("billing.invoice_changed", c.InvoiceChanged(invoice=doc), correlation_id=f"invoice:{doc.invoice_id}",
                   tenant_id=doc.tenant_id)


async def _finalize_batch(rt: Runtime, now: datetime, done: Ticked) -> bool:
    """Finalize up to BATCH due drafts; True when all of a full batch were (more may be due)."""
    finalized = len(done.finalized)
    async with UnitOfWork.begin(rt.pool, rt.outbox, name="billing.invoices.finalize") as uow:
        due = await repo.lock_due(uow.conn, now, BATCH)
        for invoice in due:
            draft = await document(uow.conn, invoice, status=rules.FINALIZED)
            if draft.totals != draft.ledger_sum or draft.entries != sum(x.entries for x in draft.lines):
                log.error("billing.invoice_unbalanced", invoice_id=str(invoice["id"]),
                          totals=[x.model_dump() for x in draft.totals],
                          ledger_sum=[x.model_dump() for x in draft.ledger_sum])
                continue      # left draft for an operator: never finalize what the ledger does not back
            row = await repo.finalize(uow.conn, invoice["id"], now, hash_of(draft))
            final = draft.model_copy(update={"finalized_at": row["finalized_at"], "content_hash": row["content_hash"],
                                             "version": row["version"], "updated_at": row["updated_at"]})
            await _emit(uow, final)
            done.finalized.append(invoice["id"])
    return len(done.finalized) - finalized == BATCH


async def _publish_batch(rt: Runtime, done: Ticked) -> bool:
    async with UnitOfWork.begin(rt.pool, rt.outbox, name="billing.invoices.publish") as uow:
        changed = await repo.lock_dirty(uow.conn, BATCH)
        for invoice in changed:
            await _emit(uow, await document(uow.conn, invoice))
            await repo.published(uow.conn, invoice["id"])
            done.published.append(invoice["id"])
    return len(changed) == BATCH


async def tick(rt: Runtime, *, now: datetime | None = None) -> Ticked:
    """Finalize every draft whose grace ended by ``now`` (default: the current time) and publish it, then
    publish every other changed invoice as billing.invoice_changed; returns what was done. Invoices another
    transaction holds are left for the next tick."""
    now, done = now or utcnow(), Ticked()
    while await _finalize_batch(rt, now, done):
        pass
    while await _publish_batch(rt, done):
        pass
    INVOICES.labels("finalized").inc(len(done.finalized))   # each batch committed by now
    INVOICES.labels("published").inc(len(done.published))
    if done.finalized or done.published:
        log.info("billing.invoices_ticked", finalized=len(done.finalized), published=len(done.published))
    return done



async def verify_ledger(rt: Runtime, req: c.VerifyLedger) -> c.LedgerVerification:
    """Recompute the ledger's chain and checkpoints now (shared.ledger_store.verify: read-only, one snapshot)."""
    started = time.perf_counter()
    async with rt.pool.acquire() as conn:
        result = await PgLedger(conn).verify()
    bad, cp = result.first_bad_entry, result.first_bad_checkpoint
    reason = "; ".join(bad.problems) if bad else (cp.problem if cp else None)
    answer = c.LedgerVerification(ok=result.ok, entries=result.entries, checkpoints=result.checkpoints,
                                  first_bad_seq=bad.seq if bad else None, bad_checkpoint=cp.id if cp else None,
                                  reason=reason, duration_ms=round((time.perf_counter() - started) * 1000, 3),
                                  at=utcnow())
    (log.info if result.ok else log.error)("billing.ledger_verified", ok=result.ok, entries=result.entries,
                                           first_bad_seq=answer.first_bad_seq, requested_by=str(req.requested_by))
    return answer
