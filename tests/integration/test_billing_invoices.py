"""Invoices against real PostgreSQL and NATS JetStream: every ledger entry billed on exactly one invoice whose
lines sum to its entries, late usage as a correction on a later invoice, finalized invoices frozen by triggers,
billing.invoice_changed published, and billing.verify_ledger answered over NATS.

Usage is rated through handlers.rating.rate_and_record (which calls invoices.assign with the real clock), so
months that must still be open are the current one and later ones; finalization is driven by
``invoices.tick(now=...)`` rather than by waiting for months to pass (the service's own tick is slowed down so
it never runs during a test)."""
from __future__ import annotations

import asyncio
import json
import uuid
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from fractions import Fraction

import asyncpg
import pytest

from services.billing import contracts as c
from services.billing.bootstrap import build
from services.billing.domain import invoices as rules
from services.billing.domain.usage import Rating, UsageRecord
from services.billing.handlers import invoices, rating
from shared import rpc
from shared.contract import load_catalog
from shared.envelope import utcnow
from shared.unit_of_work import UnitOfWork
from tests.support.polling import eventually

EARLY = datetime(2020, 1, 1, tzinfo=UTC)


async def _version(conn, version: str, effective_from: datetime, micros_per_gpu_hour: int, currency: str = "USD") -> None:
    """A version already in force (written directly: publishing refuses a past effective_from)."""
    body = {"version": version, "currency": currency, "effective_from": effective_from.isoformat(),
            "spot_discount_bps": 0, "gpu_hour": [{"micros_per_gpu_hour": micros_per_gpu_hour}],
            "gb_hour": {"standard": 100_000}}
    await conn.execute("INSERT INTO price_list_versions (version, currency, effective_from, body, published_by) "
                       "VALUES ($1, $2, $3, $4::jsonb, $5)", version, currency, effective_from, json.dumps(body),
                       uuid.uuid4())


@pytest.fixture
async def billing(run_service):
    """Billing with one USD price list in force since 2020 (3.60 per GPU-hour, 0.10 per GB-hour) and a tick
    that never runs by itself."""
    rt = await run_service("billing", lambda s: build(s, checkpoint_s=0, invoice_tick_s=3600))
    async with rt.pool.acquire() as conn:
        await conn.execute("DELETE FROM price_list_versions")
        await _version(conn, f"inv-{uuid.uuid4().hex[:8]}", EARLY, 3_600_000)
    return rt


def gpu(tenant: uuid.UUID, start: datetime, *, hours: int = 1, gpus: int = 1) -> UsageRecord:
    return UsageRecord("meter", f"{uuid.uuid4()}@{start.isoformat()}", "gpu", tenant, start,
                       start + timedelta(hours=hours), Fraction(3600 * hours * gpus), shape="vm.1gpu",
                       gpu_model="H100", pool="shared", gpu_count=gpus)


def storage(tenant: uuid.UUID, start: datetime, *, gb: int = 10, storage_class: str | None = "standard") -> UsageRecord:
    return UsageRecord("storage", f"{uuid.uuid4()}@{start.isoformat()}", "storage", tenant, start,
                       start + timedelta(hours=1), Fraction(gb * 10**9 * 3600), volume_id=uuid.uuid4(),
                       storage_class=storage_class)


async def rate(rt, records: list[UsageRecord]) -> int:
    async with UnitOfWork.begin(rt.pool, rt.outbox, name="test.rate") as uow:
        return await rating.rate_and_record(uow, records, correlation_id="test-invoices")


def months_ahead(n: int) -> rules.Period:
    p = rules.period_of(utcnow())
    for _ in range(n):
        p = p.next()
    return p


async def invoice_of(conn, tenant: uuid.UUID, period: rules.Period):
    return await conn.fetchrow("SELECT * FROM invoices WHERE tenant_id = $1 AND period_start = $2", tenant, period.start)


async def billed_on(conn, record: UsageRecord):
    return await conn.fetchrow("SELECT e.*, l.correction, l.corrects_period FROM usage_records u "
                               "JOIN invoice_entries e ON e.ledger_seq = u.ledger_seq JOIN invoice_lines l "
                               "ON l.invoice_id = e.invoice_id AND l.line_key = e.line_key "
                               "WHERE u.source = $1 AND u.event_id = $2", record.source, record.event_id)


async def assert_balanced(conn, tenants: list[uuid.UUID]) -> int:
    """For every invoice of ``tenants``: per currency, its lines' amounts and entry counts equal those of the
    ledger entries billed on it; every ledger entry of theirs is on exactly one invoice, of its tenant."""
    lines, ledger = defaultdict(lambda: [0, 0]), defaultdict(lambda: [0, 0])
    for r in await conn.fetch("SELECT l.invoice_id, l.currency, l.amount_minor, l.entries FROM invoice_lines l "
                              "JOIN invoices i ON i.id = l.invoice_id WHERE i.tenant_id = ANY($1)", tenants):
        lines[(r["invoice_id"], r["currency"])][0] += r["amount_minor"]
        lines[(r["invoice_id"], r["currency"])][1] += r["entries"]
    for r in await conn.fetch("SELECT e.invoice_id, l.currency, l.amount_minor FROM invoice_entries e "
                              "JOIN ledger_entries l ON l.seq = e.ledger_seq JOIN invoices i ON i.id = e.invoice_id "
                              "WHERE i.tenant_id = ANY($1) AND i.tenant_id = l.tenant_id", tenants):
        ledger[(r["invoice_id"], r["currency"])][0] += r["amount_minor"]
        ledger[(r["invoice_id"], r["currency"])][1] += 1
    assert lines and dict(lines) == dict(ledger)
    charges = await conn.fetch("SELECT l.seq, count(e.ledger_seq) AS n FROM ledger_entries l LEFT JOIN invoice_entries e "
                               "ON e.ledger_seq = l.seq WHERE l.tenant_id = ANY($1) AND l.kind = 'charge' GROUP BY l.seq",
                               tenants)
    assert charges and all(r["n"] == 1 for r in charges), [r["seq"] for r in charges if r["n"] != 1]
    return len(charges)


async def test_every_invoice_sums_to_its_ledger_entries_and_every_charge_is_billed_once(billing):
    cur, nxt, far = months_ahead(0), months_ahead(1), months_ahead(3)
    old = rules.period_of(cur.start - timedelta(days=200))
    async with billing.pool.acquire() as conn:      # prices change currency from `far` on
        await _version(conn, f"inv-eur-{uuid.uuid4().hex[:8]}", far.start, 2_500_000, currency="EUR")
    tenants = [uuid.uuid4() for _ in range(3)]
    late = {}
    for i, t in enumerate(tenants):
        late[t] = gpu(t, old.start + timedelta(days=3))
        await rate(billing, [gpu(t, cur.start + timedelta(hours=h), gpus=i + 1) for h in range(3)]
                   + [storage(t, cur.start + timedelta(hours=5)), storage(t, cur.start, storage_class=None)])
        await rate(billing, [storage(t, nxt.start + timedelta(days=2), gb=7 + i), gpu(t, far.start, hours=2),
                             gpu(t, far.start + timedelta(days=9), gpus=3), late[t]])
    async with billing.pool.acquire() as conn:
        assert await assert_balanced(conn, tenants) == 3 * 9
        grace = timedelta(seconds=invoices.DEFAULT_GRACE_S)
        for t in tenants:
            assert {r["period_start"] for r in await conn.fetch("SELECT period_start FROM invoices WHERE tenant_id=$1", t)} \
                >= {cur.start, nxt.start, far.start}
            goal = rules.target(late[t].period_start, utcnow(), grace, {})
            hit = await billed_on(conn, late[t])   # the old month is closed: a correction on the first open one
            assert (hit["correction"], hit["corrects_period"]) == (True, old.label)
            assert hit["invoice_id"] == (await invoice_of(conn, t, goal.period))["id"]
            docs = [await invoices.document(conn, r) for r in await conn.fetch("SELECT * FROM invoices WHERE tenant_id=$1", t)]
            assert all(d.totals == d.ledger_sum for d in docs)
            far_doc = next(d for d in docs if d.period_start == far.start)
            assert [a.currency for a in far_doc.totals] == ["EUR"]
            cur_doc = next(d for d in docs if d.period_start == cur.start)
            assert any(line.currency == "XXX" and line.amount_minor == 0 for line in cur_doc.lines)
            assert all(a.currency != "XXX" for a in cur_doc.totals)
    await invoices.tick(billing, now=far.grace_until(grace))
    async with billing.pool.acquire() as conn:
        await assert_balanced(conn, tenants)
        rows = await conn.fetch("SELECT * FROM invoices WHERE tenant_id = ANY($1)", tenants)
        assert rows and all(r["status"] == "finalized" for r in rows)
        for r in rows:
            assert invoices.hash_of(await invoices.document(conn, r)) == r["content_hash"]


async def test_usage_after_finalization_is_a_correction_on_the_next_invoice_and_the_finalized_one_stays(billing, watch):
    month, tenant = months_ahead(2), uuid.uuid4()
    rated = await watch("billing.evt.usage_rated")
    await rate(billing, [gpu(tenant, month.start + timedelta(days=4), gpus=2)])
    async with billing.pool.acquire() as conn:
        first = await invoice_of(conn, tenant, month)
    done = await invoices.tick(billing, now=first["grace_until"])
    assert first["id"] in done.finalized
    async with billing.pool.acquire() as conn:
        final = await invoice_of(conn, tenant, month)
        final_lines = await conn.fetch("SELECT * FROM invoice_lines WHERE invoice_id=$1", final["id"])
    assert final["status"] == "finalized" and final["content_hash"]
    late = gpu(tenant, month.start + timedelta(days=5))
    assert await rate(billing, [late]) == 1
    hit = (await rated.wait_for(lambda i: i[1]["data"]["usage_key"] == late.key))[0][1]["data"]
    async with billing.pool.acquire() as conn:
        after = await invoice_of(conn, tenant, month.next())
        line = await conn.fetchrow("SELECT * FROM invoice_lines WHERE invoice_id=$1", after["id"])
        assert dict(await invoice_of(conn, tenant, month)) == dict(final)
        assert await conn.fetch("SELECT * FROM invoice_lines WHERE invoice_id=$1", final["id"]) == final_lines
        assert invoices.hash_of(await invoices.document(conn, final)) == final["content_hash"]
    assert (hit["invoice_id"], hit["correction"]) == (str(after["id"]), True)
    assert after["status"] == "draft"
    assert (line["correction"], line["corrects_period"], line["amount_minor"], line["entries"]) == (
        True, month.label, 360, 1)                       # one GPU-hour at 3.60
    assert line["line_key"].startswith(f"correction:{month.label}|gpu|")


async def test_a_finalized_invoice_cannot_be_changed_even_by_a_superuser(billing, infra):
    month, tenant = months_ahead(2), uuid.uuid4()
    await rate(billing, [gpu(tenant, month.start + timedelta(hours=3))])
    await rate(billing, [gpu(tenant, month.next().start + timedelta(hours=1))])   # stays a draft, for contrast
    async with billing.pool.acquire() as conn:
        inv = await invoice_of(conn, tenant, month)
        draft = await invoice_of(conn, tenant, month.next())
    await invoices.tick(billing, now=inv["grace_until"] - timedelta(microseconds=1))
    async with billing.pool.acquire() as conn:
        assert (await invoice_of(conn, tenant, month))["status"] == "draft"      # not before its grace ends
    await invoices.tick(billing, now=inv["grace_until"])
    su = await asyncpg.connect(infra.admin_dsn, server_settings={"search_path": billing.schema})
    try:
        for sql in ("UPDATE invoice_lines SET amount_minor = 0 WHERE invoice_id = $1",
                    "DELETE FROM invoice_lines WHERE invoice_id = $1",
                    "INSERT INTO invoice_lines (invoice_id, line_key, description, kind, unit, usage_quantity, "
                    "amount_minor, currency, entries) VALUES ($1, 'extra', 'x', 'gpu', 'GPU-hours', 1, 1, 'USD', 1)",
                    "UPDATE invoice_entries SET line_key = line_key WHERE invoice_id = $1",
                    "DELETE FROM invoice_entries WHERE invoice_id = $1",
                    "UPDATE invoices SET dirty = true WHERE id = $1",
                    "UPDATE invoices SET status = 'draft', finalized_at = NULL, content_hash = NULL WHERE id = $1",
                    "DELETE FROM invoices WHERE id = $1"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError, match="finalized"):
                await su.execute(sql, inv["id"])
        async with su.transaction():   # refused (and rolled back, should it ever pass)
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await su.execute("TRUNCATE invoice_lines CASCADE")
        tr = su.transaction()          # the triggers target finalized invoices only (rolled back)
        await tr.start()
        assert await su.execute("UPDATE invoice_lines SET amount_minor = 0 WHERE invoice_id = $1",
                                draft["id"]) == "UPDATE 1"
        await tr.rollback()
    finally:
        await su.close()
    async with billing.pool.acquire() as conn:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):     # the service role: trigger
            await conn.execute("UPDATE invoice_lines SET amount_minor = 0 WHERE invoice_id = $1", inv["id"])
        with pytest.raises(asyncpg.InsufficientPrivilegeError):     # the service role: no DELETE at all
            await conn.execute("DELETE FROM invoice_lines WHERE invoice_id = $1", draft["id"])
        assert await conn.fetchval("SELECT sum(amount_minor) FROM invoice_lines WHERE invoice_id=$1", draft["id"]) == 360
        final = await invoice_of(conn, tenant, month)
        assert final["status"] == "finalized" and final["version"] == inv["version"] + 1
        assert invoices.hash_of(await invoices.document(conn, final)) == final["content_hash"]


async def test_invoice_changed_is_published_with_the_document_draft_then_finalized(billing, watch):
    month, tenant = months_ahead(1), uuid.uuid4()
    changed = await watch("billing.evt.invoice_changed")
    await rate(billing, [gpu(tenant, month.start + timedelta(hours=h)) for h in (1, 2)]
               + [storage(tenant, month.start + timedelta(hours=4))])
    await invoices.tick(billing, now=utcnow())
    mine = lambda i: i[1]["data"]["invoice"]["tenant_id"] == str(tenant)   # noqa: E731
    draft = (await changed.wait_for(mine))[0][1]["data"]["invoice"]
    assert draft["status"] == "draft" and draft["content_hash"] is None and draft["number"].startswith(
        f"TSR-{month.start:%Y%m}-{tenant.hex[:8]}")
    assert sorted((x["kind"], x["quantity"], x["amount_minor"], x["entries"]) for x in draft["lines"]) == [
        ("gpu", "2", 720, 2), ("storage", "10", 100, 1)]          # 2 GPU-hours at 3.60, 10 GB-hours at 0.10
    assert draft["totals"] == draft["ledger_sum"] == [{"currency": "USD", "amount_minor": 820}] and draft["entries"] == 3
    async with billing.pool.acquire() as conn:
        assert not (await invoice_of(conn, tenant, month))["dirty"]
    await invoices.tick(billing, now=month.grace_until(timedelta(seconds=invoices.DEFAULT_GRACE_S)))
    final = (await changed.wait_for(lambda i: mine(i) and i[1]["data"]["invoice"]["status"] == "finalized"))[0][1]
    doc = final["data"]["invoice"]
    assert [i[1]["data"]["invoice"]["status"] for i in changed.items if mine(i)] == ["draft", "finalized"]
    async with billing.pool.acquire() as conn:
        row = await invoice_of(conn, tenant, month)
    assert doc["content_hash"] == row["content_hash"] and doc["version"] == row["version"] > draft["version"]
    assert doc["lines"] == draft["lines"] and doc["totals"] == draft["totals"] and doc["finalized_at"]
    assert doc["content_hash"] == rules.content_hash(doc["lines"], doc["totals"])


async def test_rating_the_same_records_twice_bills_them_once(billing):
    tenant, start = uuid.uuid4(), months_ahead(0).start
    records = [gpu(tenant, start + timedelta(hours=h)) for h in range(3)] + [storage(tenant, start)]
    assert await rate(billing, records) == 4
    assert await rate(billing, records) == 0
    assert await rate(billing, records[:2] + records[:2]) == 0
    async with billing.pool.acquire() as conn:
        inv = await invoice_of(conn, tenant, months_ahead(0))
        seq = await conn.fetchval("SELECT ledger_seq FROM usage_records WHERE event_id = $1", records[0].event_id)
    async with UnitOfWork.begin(billing.pool, billing.outbox, name="test.assign") as uow:   # assign is idempotent
        again = await invoices.assign(uow, records[0], Rating(360, "USD", True), seq)
    assert again == invoices.Billed(inv["id"], False)
    async with billing.pool.acquire() as conn:
        assert await assert_balanced(conn, [tenant]) == 4
        assert await conn.fetchval("SELECT count(*) FROM invoice_entries WHERE invoice_id=$1", inv["id"]) == 4
        assert await conn.fetchval("SELECT sum(entries) FROM invoice_lines WHERE invoice_id=$1", inv["id"]) == 4
        assert await conn.fetchval("SELECT sum(amount_minor) FROM invoice_lines WHERE invoice_id=$1", inv["id"]) == \
            3 * 360 + 100
        assert (await invoice_of(conn, tenant, months_ahead(0)))["version"] == inv["version"]


async def test_verify_ledger_is_answered_over_nats_and_names_a_tampered_entry(billing, nc, infra):
    tenant = uuid.uuid4()
    record = gpu(tenant, months_ahead(0).start)
    await rate(billing, [record])
    ask = lambda: rpc.request(nc, load_catalog(), "gateway", "billing.verify_ledger",   # noqa: E731
                              c.VerifyLedger(requested_by=uuid.uuid4()), timeout=30)
    ok = await ask()
    async with billing.pool.acquire() as conn:
        victim = await conn.fetchval("SELECT ledger_seq FROM usage_records WHERE event_id = $1", record.event_id)
        entries = await conn.fetchval("SELECT count(*) FROM ledger_entries")
    assert isinstance(ok, c.LedgerVerification) and ok.ok and ok.entries >= entries and ok.first_bad_seq is None
    assert ok.duration_ms >= 0 and ok.reason is None
    su = await asyncpg.connect(infra.admin_dsn)
    table = f"{billing.schema}.ledger_entries"

    async def tamper(delta: int) -> None:
        async with su.transaction():
            await su.execute("SET LOCAL session_replication_role = replica")
            await su.execute(f"UPDATE {table} SET amount_minor = amount_minor + $2 WHERE seq = $1", victim, delta)
    try:
        await tamper(1)
        try:
            broken = await ask()
            assert not broken.ok and broken.first_bad_seq == victim and "row_hash" in broken.reason
        finally:
            await tamper(-1)
    finally:
        await su.close()
    assert (await ask()).ok


async def test_two_ticks_at_once_finalize_each_due_invoice_once(billing, watch):
    month, tenants = months_ahead(2), [uuid.uuid4() for _ in range(6)]
    changed = await watch("billing.evt.invoice_changed")
    for t in tenants:
        await rate(billing, [gpu(t, month.start + timedelta(days=1))])
    async with billing.pool.acquire() as conn:
        ids = {(await invoice_of(conn, t, month))["id"] for t in tenants}
    at = month.grace_until(timedelta(seconds=invoices.DEFAULT_GRACE_S))
    a, b = await asyncio.gather(invoices.tick(billing, now=at), invoices.tick(billing, now=at))
    assert ids <= set(a.finalized) | set(b.finalized) and not set(a.finalized) & set(b.finalized)
    final = lambda i: (i[1]["data"]["invoice"]["invoice_id"] in {str(x) for x in ids}   # noqa: E731
                       and i[1]["data"]["invoice"]["status"] == "finalized")
    await changed.wait_for(lambda i: final(i) and len([j for j in changed.items if final(j)]) >= len(ids))
    assert len([i for i in changed.items if final(i)]) == len(ids)


async def test_a_line_written_while_its_invoice_is_being_finalized_waits_and_is_refused(billing):
    month, tenant = months_ahead(2), uuid.uuid4()
    await rate(billing, [gpu(tenant, month.start)])
    async with billing.pool.acquire() as finalizer, billing.pool.acquire() as writer:
        inv = await invoice_of(finalizer, tenant, month)
        tr = finalizer.transaction()
        await tr.start()
        await finalizer.execute("UPDATE invoices SET status = 'finalized', finalized_at = now(), dirty = false, "
                                "content_hash = repeat('0', 64) WHERE id = $1", inv["id"])
        pid = writer.get_server_pid()
        write = asyncio.create_task(writer.execute(
            "UPDATE invoice_lines SET amount_minor = amount_minor + 1 WHERE invoice_id = $1", inv["id"]))
        await eventually(lambda: finalizer.fetchval("SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1", pid),
                         until=lambda w: w == "Lock", timeout=10, what="the line update to wait for the invoice")
        await tr.commit()
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="finalized"):
            await write
        assert await finalizer.fetchval("SELECT sum(amount_minor) FROM invoice_lines WHERE invoice_id=$1",
                                        inv["id"]) == 360


async def test_a_batch_of_many_tenants_and_months_is_one_append_and_bills_each_record_once(billing):
    tenants, months = [uuid.uuid4() for _ in range(5)], [months_ahead(1), months_ahead(2)]
    records = [(gpu if i % 3 else storage)(tenants[i % 5], months[i % 2].start + timedelta(hours=i)) for i in range(40)]
    async with billing.pool.acquire() as conn:
        head = await conn.fetchval("SELECT coalesce(max(seq), 0) FROM ledger_entries")
    assert await rate(billing, records[:30] + records[:5]) == 30    # a key twice in one batch counts once
    assert await rate(billing, records) == 10                        # those stored are skipped
    async with billing.pool.acquire() as conn:
        seqs = [r["ledger_seq"] for r in await conn.fetch(
            "SELECT ledger_seq FROM usage_records WHERE event_id = ANY($1) ORDER BY ledger_seq",
            [r.event_id for r in records])]
        assert seqs == list(range(head + 1, head + 41))               # one run of the chain, in record order
        assert await assert_balanced(conn, tenants) == 40
        versions = await conn.fetch("SELECT i.version, count(e.*) AS n FROM invoices i JOIN invoice_entries e "
                                    "ON e.invoice_id = i.id WHERE i.tenant_id = ANY($1) GROUP BY i.id", tenants)
        assert len(versions) == 10 and all(v["version"] == 1 + v["n"] for v in versions)   # one version per entry


async def test_a_transaction_rating_twice_and_one_rating_its_second_tenant_do_not_wait_on_each_other(billing):
    """A consumer's batch may rate several times in one transaction, the ledger's lock held from the first: the
    invoices of the next are locked after it. Another transaction rating one of those tenants waits for the
    ledger's lock holding no invoice, instead of holding the invoice the first one is about to lock."""
    a, b, month = uuid.uuid4(), uuid.uuid4(), months_ahead(0)
    async with billing.pool.acquire() as observer, billing.pool.acquire() as other_conn:
        pid = other_conn.get_server_pid()

        async def other() -> int:
            async with other_conn.transaction():
                uow = UnitOfWork(other_conn, billing.outbox, name="test.rate-other")
                return await rating.rate_and_record(uow, [gpu(b, month.start)], correlation_id="test-invoices")

        async with UnitOfWork.begin(billing.pool, billing.outbox, name="test.rate-twice") as uow:
            assert await rating.rate_and_record(uow, [gpu(a, month.start)], correlation_id="test-invoices") == 1
            waiting = asyncio.create_task(other())
            await eventually(lambda: observer.fetchval("SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1",
                                                       pid),
                             until=lambda w: w == "Lock", timeout=10, what="the other rating to wait for a lock")
            assert await rating.rate_and_record(uow, [gpu(b, month.start + timedelta(hours=1))],
                                                correlation_id="test-invoices") == 1
        assert await waiting == 1
        assert await assert_balanced(observer, [a, b]) == 3
        assert (await invoice_of(observer, b, month))["version"] >= 2
