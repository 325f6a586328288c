"""Metering → rating → ledger, and the price lists, as billing's application layer.

Every usage record is rated and appended to the ledger in the unit of work that records it: the record, its
ledger entry (``source_event`` = the record's key) and the ``billing.usage_rated`` event commit together or
not at all. The records of one call are a batch: one ledger append, one insert of each kind. A record
already there (a redelivered stop, a replayed report) is skipped before anything is written, under the lock
of what it was measured from (the meter's row, the volume's row), so it counts once in usage and once in the
ledger. Rules: services/billing/domain/usage.py.
"""
from __future__ import annotations

import uuid
from datetime import datetime

import structlog

from shared.envelope import utcnow
from shared.runtime import Runtime
from shared.unit_of_work import UnitOfWork

from .. import contracts as c
from ..adapters import rating as repo
from ..adapters import repository as meters_repo
from ..adapters.ledger import Charge, PgLedger
from ..adapters.metrics import CHARGED, USAGE_RATED
from ..domain.model import Meter
from ..domain.pricing import ImmutableVersionError, PricingError
from ..domain.usage import Rating, UsageRecord, meter_records, rate, storage_record, version_from_doc
from .budgets import budgeted
from .budgets import usage_recorded as check_budgets
from .invoices import Billed, bill, invoice_statuses, open_invoices
from .rollups import touched
from .rollups import usage_recorded as roll_up

log = structlog.get_logger()


def _iso(t: datetime) -> str:
    return t.isoformat()


async def rate_and_record(ctx: UnitOfWork, records: list[UsageRecord], *, correlation_id: str | None = None,
                          grace_s: int | None = None) -> int:
    """Rate each new record (its quoted price, or the price list in force: domain/usage.py), append them to the
    ledger, store them and publish billing.usage_rated for each (correlated by ``correlation_id``, else a meter
    record by its allocation, else by the causing message); records already stored are skipped. Then update
    the hourly rollups and check the budgets of what changed. Returns how many were new.

    Set-based: one ledger append (one lock, one insert), one usage insert and a few invoice statements per
    call, however many records; the ledger's lock, held from the append to the commit, is what serialises
    every rating transaction, so the work done under it is a handful of statements, not a few per record.
    What needs no lock comes before it: the rating, the tenants' budgets and their invoices' statuses. The
    invoices are locked after it (invoices.open_invoices): a transaction may rate several times (a consumer's
    batch), so taking them first in one call would follow the ledger's lock in the next, and two such
    transactions could wait on each other."""
    conn = ctx.conn
    new = await repo.new_records(conn, records)
    if not new:
        return 0
    prices = await repo.price_list(conn)
    ratings = [rate(r, prices) for r in new]
    charges = [_charge(r, rating) for r, rating in zip(new, ratings)]
    tenants = sorted({r.tenant_id for r in new})
    budgets = await budgeted(ctx, tenants)                 # reads without a lock: before the ledger's (see above)
    statuses = await invoice_statuses(ctx, new)
    appended = await PgLedger(conn).record_many(charges)
    opened = await open_invoices(ctx, list(zip(new, ratings)), grace_s=grace_s, known=statuses)
    rated = [(r, rating, a.seq) for r, rating, a in zip(new, ratings, appended)]
    sums = await repo.record_usage(conn, rated, touched(new))   # the rollups' sums, with the new records
    billed = await bill(ctx, opened, [a.seq for a in appended])
    await _emit_rated(ctx, rated, billed, correlation_id)
    ctx.on_commit(lambda: _count([(r.kind, rating) for r, rating in zip(new, ratings)]))
    await roll_up(ctx, new, sums=sums)
    await check_budgets(ctx, tenants, budgets=budgets)
    return len(new)


def _charge(r: UsageRecord, rating: Rating) -> Charge:
    entry = {"usage_key": r.key, "kind": r.kind, "period_start": _iso(r.period_start),
             "period_end": _iso(r.period_end), "quantity": r.quantity_text, "rated": rating.rated,
             "price_list_version": rating.price_version, "sku_price_id": rating.sku_price_id,
             "reason": rating.reason, **rating.detail,
             **{k: str(v) for k, v in (("allocation_id", r.allocation_id), ("volume_id", r.volume_id),
                                       ("user_id", r.user_id)) if v is not None},
             **{k: v for k, v in (("shape", r.shape), ("gpu_model", r.gpu_model), ("pool", r.pool),
                                  ("storage_class", r.storage_class)) if v is not None},
             "spot": r.spot}
    return Charge(r.tenant_id, "charge", r.key, rating.amount_minor, rating.currency, entry)


async def _emit_rated(ctx: UnitOfWork, rated: list[tuple[UsageRecord, Rating, int]], billed: list[Billed],
                      correlation_id: str | None) -> None:
    """billing.usage_rated for each record, in order within each (correlation, tenant): one outbox write
    per pair (a meter's records are one pair; an envelope has one tenant and one correlation)."""
    groups: dict[tuple[str | None, uuid.UUID], list] = {}
    for (r, rating, seq), b in zip(rated, billed):
        corr = correlation_id or (str(r.allocation_id) if r.allocation_id else None)
        groups.setdefault((corr, r.tenant_id), []).append(("billing.usage_rated", c.UsageRated(
            usage_key=r.key, kind=r.kind, tenant_id=r.tenant_id, user_id=r.user_id, allocation_id=r.allocation_id,
            volume_id=r.volume_id, shape=r.shape, gpu_model=r.gpu_model, pool=r.pool, spot=r.spot,
            storage_class=r.storage_class, period_start=r.period_start, period_end=r.period_end,
            quantity=r.quantity_text, amount_minor=rating.amount_minor, currency=rating.currency,
            rated=rating.rated, price_list_version=rating.price_version, sku_price_id=rating.sku_price_id,
            reason=rating.reason, ledger_seq=seq, list_amount_minor=rating.list_amount_minor,
            micros_per_unit_hour=rating.micros_per_unit_hour, invoice_id=b.invoice_id,
            correction=b.correction), None))
    for (corr, tenant_id), events in groups.items():
        await ctx.emit_many(events, correlation_id=corr, tenant_id=tenant_id)


async def _count(rated: list[tuple[str, Rating]]) -> None:
    for kind, rating in rated:
        USAGE_RATED.labels(kind, str(rating.rated).lower()).inc()
        CHARGED.labels(rating.currency).inc(max(rating.amount_minor, 0))


async def meter_stopped(ctx: UnitOfWork, meter: Meter, *, grace_s: int | None = None) -> int:
    """Record and rate the usage of a stopped (and locked) meter not cut yet, [cut_until, stopped_at); a
    redelivered stop finds it all recorded and writes nothing."""
    if meter.stopped_at is None:
        return 0
    records = meter_records(meter, meter.stopped_at)
    new = await rate_and_record(ctx, records, correlation_id=str(meter.allocation_id), grace_s=grace_s)
    await meters_repo.save_cut(ctx.conn, meter.id, meter.stopped_at)
    return new


# --- price lists ------------------------------------------------------------------------------------------------
async def publish_price_list(ctx: UnitOfWork, cmd: c.PublishPriceList, *, clock=utcnow) -> None:
    """Validate the version against every stored one (pricing.PriceList.publish: an effective version is
    immutable, none takes effect in the past), store it and publish billing.price_list_published; a refusal
    stores nothing and publishes billing.price_list_rejected (the command is acknowledged either way)."""
    conn = ctx.conn
    await repo.lock_price_lists(conn)
    doc = cmd.model_dump(mode="json", exclude={"requested_by"})
    now = clock()
    try:
        version = version_from_doc({**doc, "effective_from": cmd.effective_from})
        (await repo.price_list(conn)).publish(version, now)
    except PricingError as exc:
        log.warning("billing.price_list_rejected", version=cmd.version, reason=str(exc),
                    immutable=isinstance(exc, ImmutableVersionError))
        await ctx.emit("billing.price_list_rejected", c.PriceListRejected(
            version=cmd.version, reason=str(exc)[:2000], field=exc.field, requested_by=cmd.requested_by, at=now),
            correlation_id=f"price-list:{cmd.version}")
        return
    published_at = await repo.store_version(conn, doc, cmd.effective_from, cmd.requested_by)
    await ctx.emit("billing.price_list_published", c.PriceListPublished(
        **cmd.model_dump(exclude={"requested_by"}), published_by=cmd.requested_by, published_at=published_at),
        correlation_id=f"price-list:{cmd.version}")


# --- storage ----------------------------------------------------------------------------------------------------
async def on_volume_changed(ctx: UnitOfWork, data) -> None:
    """Remember each volume's class and owner (usage reports carry neither)."""
    v = data.volume
    await repo.note_volume(ctx.conn, v.volume_id, v.tenant_id, v.user_id, v.storage_class)


async def on_usage_reported(ctx: UnitOfWork, data, *, grace_s: int | None = None) -> None:
    """Close each volume's interval since its previous report (bytes used then × seconds since) and rate it.

    A report not later than the volume's last one is dropped: a replay, or one overtaken by a newer report
    (reports are consumed by several workers). The time is still billed once, by the newer report, at the bytes
    of the report before the dropped one; only the dropped report's byte count is lost."""
    records = []
    for v in sorted(data.volumes, key=lambda v: v.volume_id):   # one lock order for every report
        row = await repo.volume_for_report(ctx.conn, v.volume_id, data.tenant_id)
        if row["last_report_at"] is not None and data.at <= row["last_report_at"]:
            continue   # a replayed or older report: already counted
        if row["last_report_at"] is not None:
            r = storage_record(volume_id=v.volume_id, tenant_id=row["tenant_id"], user_id=row["user_id"],
                               storage_class=row["storage_class"], used_bytes=row["last_used_bytes"],
                               since=row["last_report_at"], until=data.at)
            if r is not None:
                records.append(r)
        await repo.save_report(ctx.conn, v.volume_id, v.used_bytes, data.at)
    await rate_and_record(ctx, records, grace_s=grace_s)


# --- checkpoints ------------------------------------------------------------------------------------------------
async def checkpoint(rt: Runtime) -> c.LedgerCheckpointed | None:
    """Store a Merkle checkpoint over the whole ledger when it grew since the last one, and publish it."""
    async with UnitOfWork.begin(rt.pool, rt.outbox, name="billing.checkpoint") as uow:
        last = await uow.conn.fetchval("SELECT max(last_seq) FROM ledger_entries_checkpoints")
        head = await uow.conn.fetchval("SELECT max(seq) FROM ledger_entries")
        if head is None or head == last:
            return None
        cp = await PgLedger(uow.conn).checkpoint()
        if cp is None:
            return None
        event = c.LedgerCheckpointed(tree_size=cp.tree_size, first_seq=cp.first_seq, last_seq=cp.last_seq,
                                     root_hash=cp.root_hash.hex(), at=cp.created_at)
        await uow.emit("billing.ledger_checkpointed", event, correlation_id="billing-ledger")
    log.info("billing.ledger_checkpointed", tree_size=cp.tree_size, root=cp.root_hash.hex())
    return event

