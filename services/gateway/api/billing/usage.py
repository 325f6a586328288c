"""Price lists and usage.

``PUT /v1/price-lists/{version}`` (provider admin) validates the version with billing's own pure rules
(services.billing.domain: the version's fields, and against the versions this gateway has seen: an effective
version is immutable, none takes effect in the past) and sends ``billing.publish_price_list``; billing checks
again against its own store and publishes the version or its refusal, which ``GET /v1/price-lists`` shows.

``GET /v1/usage`` reads usage_view, which the gateway projects from ``billing.usage_rated`` (one row per usage
record). A projection rather than a request/reply to billing: the gateway already answers every read from its
own views, tenant scoping is one SQL condition, and a read never waits on billing being up.

``GET /v1/focus`` is a month of that usage as a FOCUS 1.2 CSV (``focus_line`` builds each row from the stored
figures, never rating again). ``GET /v1/ops/ledger/verify`` asks billing to recompute its ledger
(``billing.verify_ledger``, request/reply: a verification is a live answer, not a stored one; 503 when billing
does not answer).
"""
from __future__ import annotations

import io
import json
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from typing import Literal

import structlog
from aiohttp import web

from services.billing import contracts as bc
from services.billing.contracts import VERSION_PATTERN, PublishPriceList
from services.billing.contracts.pricing import PricingError, check_price_list, currency_exponent, focus
from shared import rpc

from ...adapters.audit_state import StateReader, plain, select_object
from ...http.auth import principal_of, require_provider_admin
from ...http.endpoint import TEXT_CSV, Endpoint, Param, respond
from ...http.inputs import path_value, query_value, read_body
from ...http.problems import ProblemError, validation_problem
from ...http.rpc_problems import answered
from ...http.schema_base import FieldError, Instant, text
from ...http.state import gateway_of
from .invoice_schemas import PERIOD_PATTERN
from .invoices import invoice_reader, month_bounds, scoped_tenant
from .usage_schemas import (
    GpuPriceOut,
    LedgerVerificationOut,
    PriceListAccepted,
    PriceListList,
    PriceListOut,
    PriceListPut,
    PriceListRejectionOut,
    UsageGroupOut,
    UsageReport,
)

log = structlog.get_logger()
# the wire's units (services.billing.contracts): GPU-seconds, byte-seconds (GB = 10**9 bytes), prices in micros
_GPU_SECONDS_PER_HOUR, _BYTE_SECONDS_PER_GB_HOUR, _MICROS = 3600, 10**9 * 3600, 10**6
LEDGER_VERIFY_TIMEOUT_S = 60.0      # billing reads its whole ledger: seconds for a large one

VERSION = Param("version", "path", "The version's id (letters, digits, '.', '_', '-').",
                text(64, min_length=1, pattern=VERSION_PATTERN), required=True)
FROM = Param("from", "query", "Usage from this instant on (RFC 3339; default: 30 days before `to`).", Instant)
TO = Param("to", "query", "Usage before this instant (RFC 3339; default: now).", Instant)
GROUP_BY = Param("group_by", "query", "Group the usage by this (spot: 'spot' or 'on-demand'; user: the user's id).",
                 Literal["shape", "gpu_model", "pool", "storage_class", "user", "spot", "day", "hour"])
TENANT = Param("tenant_id", "query", "Whose usage (provider admins; members always read their own tenant's).",
               uuid.UUID)
FOCUS_PERIOD = Param("period", "query", "The billing period: a UTC calendar month, YYYY-MM.",
                     text(7, min_length=7, pattern=PERIOD_PATTERN), required=True)
FOCUS_TENANT = Param("tenant_id", "query", "Whose file: provider admins name a tenant, or none for the "
                                           "provider-wide file; tenant admins always get their own tenant's.",
                     uuid.UUID)
_WIRE_FIELDS = {"gpu_hour": "gpu_prices", "micros_per_gpu_hour": "gpu_prices", "gb_hour": "storage_prices",
                "storage_class": "storage_prices", "micros_per_gb_hour": "storage_prices"}   # domain → API names
_GROUPS = {"shape": "shape", "gpu_model": "gpu_model", "pool": "pool", "storage_class": "storage_class",
           "user": "user_id::text", "spot": "CASE WHEN kind = 'gpu' THEN CASE WHEN spot THEN 'spot' ELSE 'on-demand' END END",
           "day": "to_char(date_trunc('day', period_start, 'UTC'), 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')",
           "hour": "to_char(date_trunc('hour', period_start, 'UTC'), 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')"}


def _body(row) -> dict:
    return json.loads(row["body"]) if isinstance(row["body"], str) else dict(row["body"])


def _check(doc: dict, rows: list, now: datetime) -> None:
    """Billing's rules (contracts.pricing.check_price_list), here first, over the versions this gateway has seen: a 422
    naming the field, a 409 for a version already in force."""
    published = [{**_body(r), "effective_from": r["effective_from"]} for r in rows]
    problem = check_price_list(doc, published, now)
    if problem is not None and problem.immutable:
        raise ProblemError(409, problem.message)
    if problem is not None:
        field = _WIRE_FIELDS.get(problem.field, problem.field)
        raise validation_problem([FieldError(field=field, message=problem.message, code="price_list_rule")])


async def put_price_list(request: web.Request) -> web.Response:
    admin = require_provider_admin(request)
    version = path_value(request, VERSION)
    body = await read_body(request, PriceListPut)
    doc = {"version": version, "currency": body.currency, "effective_from": body.effective_from,
           "gpu_hour": [p.model_dump() for p in body.gpu_prices], "gb_hour": dict(body.storage_prices),
           "spot_discount_bps": body.spot_discount_bps}
    gw = gateway_of(request)
    async with gw.unit_of_work("gateway.put_price_list") as uow:
        rows = await uow.conn.fetch("SELECT effective_from, body FROM price_lists_view")
        _check(doc, rows, datetime.now(UTC))
        await uow.emit("billing.publish_price_list", PublishPriceList(**doc, requested_by=admin.user_id),
                       correlation_id=f"price-list:{version}")
    return respond(PriceListAccepted(version=version, status="publishing"), 202)


async def list_price_lists(request: web.Request) -> web.Response:
    caller = principal_of(request)
    now = datetime.now(UTC)
    async with gateway_of(request).pool.acquire() as conn:
        rows = await conn.fetch("SELECT * FROM price_lists_view ORDER BY effective_from")
        rejected = (await conn.fetch("SELECT * FROM price_list_rejections ORDER BY at DESC LIMIT 50")
                    if caller.is_provider_admin else [])
    in_force = max((r["version"] for r in rows if r["effective_from"] <= now),
                   key=lambda v: next(r["effective_from"] for r in rows if r["version"] == v), default=None)
    items = []
    for r in rows:
        b = _body(r)
        items.append(PriceListOut(
            version=r["version"], currency=r["currency"], effective_from=r["effective_from"],
            gpu_prices=[GpuPriceOut(**p) for p in b.get("gpu_hour", [])], storage_prices=b.get("gb_hour", {}),
            spot_discount_bps=b.get("spot_discount_bps", 0), in_force=r["version"] == in_force,
            published_by=r["published_by"] if caller.is_provider_admin else None, published_at=r["published_at"]))
    return respond(PriceListList(items=items, rejections=[
        PriceListRejectionOut(version=r["version"], reason=r["reason"], field=r["field"], at=r["at"]) for r in rejected]))


def _usage_tenant(request: web.Request) -> uuid.UUID | None:
    """Members: their own tenant (another tenant_id is an empty 404, never a 403). Provider admins: the one
    named, or every tenant."""
    caller, named = principal_of(request), query_value(request, TENANT)
    if caller.is_provider_admin:
        return named
    if caller.tenant_id is None or (named is not None and named != caller.tenant_id):
        raise ProblemError(404, "no such tenant")
    return caller.tenant_id


async def get_usage(request: web.Request) -> web.Response:
    tenant_id = _usage_tenant(request)
    end = query_value(request, TO) or datetime.now(UTC)
    start = query_value(request, FROM) or end - timedelta(days=30)
    group_by = query_value(request, GROUP_BY)
    # [from, to) with from >= to is empty: an empty report, like any interval without usage
    key = _GROUPS[group_by] if group_by else "NULL::text"
    async with gateway_of(request).pool.acquire() as conn:
        rows = await conn.fetch(
            f"SELECT {key} AS key, CASE WHEN rated THEN currency END AS currency, "
            "coalesce(sum(quantity) FILTER (WHERE kind = 'gpu'), 0) AS gpu_seconds, "
            "coalesce(sum(quantity) FILTER (WHERE kind = 'storage'), 0) AS byte_seconds, "
            "sum(amount_minor) AS amount_minor, count(*) AS records, count(*) FILTER (WHERE NOT rated) AS unrated "
            "FROM usage_view WHERE ($1::uuid IS NULL OR tenant_id = $1) AND period_start >= $2 AND period_start < $3 "
            "GROUP BY 1, 2 ORDER BY 1 NULLS FIRST, 2 NULLS FIRST", tenant_id, start, end)
    groups = [UsageGroupOut(key=r["key"], currency=r["currency"], gpu_seconds=format(r["gpu_seconds"], "f"),
                            gb_hours=format(Decimal(r["byte_seconds"]) / Decimal(3600 * 10**9), "f"),
                            amount_minor=r["amount_minor"], records=r["records"], unrated_records=r["unrated"])
              for r in rows]
    return respond(UsageReport(tenant_id=tenant_id, start=start, end=end, group_by=group_by, groups=groups))


# --- FOCUS export --------------------------------------------------------------------------------------------

_SCOPE = ("($1::uuid IS NULL OR u.tenant_id = $1) AND ((NOT u.correction AND u.period_start >= $2 AND u.period_start < $3) "
          "OR (u.correction AND u.invoice_id IN (SELECT invoice_id FROM invoices_view "
          "WHERE period_start >= $2 AND period_start < $3)))")
_EXPORTABLE = "u.rated AND u.currency ~ '^[A-Z]{3}$' AND u.currency <> 'XXX'"
_FOCUS_ROWS = (
    "SELECT u.*, t.name AS tenant_name, coalesce(a.name, v.name) AS resource_name FROM usage_view u "
    "LEFT JOIN tenants t ON t.id = u.tenant_id LEFT JOIN allocations_view a ON a.id = u.allocation_id "
    f"LEFT JOIN volumes_view v ON v.id = u.volume_id WHERE {_SCOPE} AND {_EXPORTABLE} "
    "ORDER BY u.tenant_id, u.correction, u.period_start, u.usage_key")


def _charge_period(start: datetime, end: datetime, p_start: datetime, p_end: datetime) -> tuple[datetime, datetime]:
    """A record's charge period as FOCUS takes it in [p_start, p_end): one that started before the period is late
    usage (a correction), shown ending at the period start at the latest; one starting in it ends at its end at
    the latest. A storage record runs until its volume's next report and may cross a month boundary: its amount
    stays whole, on the invoice billing put it on."""
    return (start, min(end, p_start)) if start < p_start else (start, min(end, p_end))


def focus_line(r, period: focus.BillingPeriod) -> focus.RatedLine:
    """A usage_view row (joined with its tenant's and resource's names) as a FOCUS line, from the figures billing
    published: billed = amount_minor, list = list_amount_minor (the billed amount for records projected before
    the list amount was), list price = micros_per_unit_hour, quantity = GPU-seconds / 3600 or byte-seconds /
    (10**9 x 3600), exactly."""
    gpu = r["kind"] == "gpu"
    hours = Fraction(Decimal(r["quantity"])) / (_GPU_SECONDS_PER_HOUR if gpu else _BYTE_SECONDS_PER_GB_HOUR)
    billed = r["amount_minor"]
    listed = r["list_amount_minor"] or billed
    micros = r["micros_per_unit_hour"]
    if micros is None:    # not published: the list amount per unit-hour (exact)
        exact = Fraction(listed * _MICROS, 10 ** currency_exponent(r["currency"]))
        micros = exact / hours if hours else Fraction(0)
    sku_price_id = r["sku_price_id"] or f"{'gpu-hour' if gpu else 'gb-hour'}@{r['price_version'] or 'unknown'}"
    if gpu:
        what = ", ".join(x for x in (r["gpu_model"] or "GPU", r["shape"] and f"shape {r['shape']}",
                                     r["pool"] and f"pool {r['pool']}") if x)
        description = f"GPU-hours: {what}" + (" (spot)" if r["spot"] else "")
    else:
        description = f"GB-hours: {r['storage_class'] or 'storage'} volume"
    resource_id = str(r["allocation_id"] or r["volume_id"] or r["usage_key"])
    start, end = _charge_period(r["period_start"], r["period_end"], period.start, period.end)
    return focus.RatedLine(
        tenant_id=str(r["tenant_id"]), tenant_name=r["tenant_name"] or str(r["tenant_id"]), resource_id=resource_id,
        resource_name=r["resource_name"] or resource_id, resource_type="GPU Allocation" if gpu else "Volume",
        start=start, end=end, quantity=hours, unit=focus.GPU_HOURS if gpu else focus.GB_HOURS,
        currency=r["currency"], list_micros_per_unit_hour=Fraction(micros), list_minor=listed, billed_minor=billed,
        sku_id=sku_price_id.split("@", 1)[0], sku_price_id=sku_price_id,
        service_name="Tessera GPU Compute" if gpu else "Tessera Block Storage",
        service_category="Compute" if gpu else "Storage", description=description, spot=r["spot"],
        gpu_model=r["gpu_model"], shape=r["shape"], pool=r["pool"], storage_class=r["storage_class"])


def _csv(rows: list[dict], header: bool) -> bytes:
    buf = io.StringIO(newline="")
    focus.write_csv(rows, buf)
    out = buf.getvalue()
    return (out if header else out.split("\r\n", 1)[1]).encode()


async def export_focus(request: web.Request) -> web.StreamResponse:
    """A month's rated usage (and the corrections billed in it) as FOCUS rows, streamed from one snapshot. Each
    tenant's rows name its billing account (the tenant) and its invoice of the month."""
    tenant_id = scoped_tenant(invoice_reader(request), query_value(request, FOCUS_TENANT))
    period = query_value(request, FOCUS_PERIOD)
    if period is None:
        raise validation_problem([FieldError(field="period", message="required: YYYY-MM", code="missing")])
    start, end = month_bounds(period)
    name = f"focus-{tenant_id or 'provider'}-{period}.csv"
    async with gateway_of(request).pool.acquire() as conn, conn.transaction(isolation="repeatable_read",
                                                                            readonly=True):
        unrated = await conn.fetchval(f"SELECT count(*) FROM usage_view u WHERE {_SCOPE} AND NOT ({_EXPORTABLE})",
                                      tenant_id, start, end)
        invoices = dict(await conn.fetch("SELECT tenant_id, invoice_id FROM invoices_view WHERE "
                                         "($1::uuid IS NULL OR tenant_id = $1) AND period_start >= $2 AND "
                                         "period_start < $3", tenant_id, start, end))
        resp = web.StreamResponse(headers={
            "Content-Type": f"{TEXT_CSV}; charset=utf-8", "Content-Disposition": f"attachment; filename={name}",
            "Tessera-Unrated-Records": str(unrated), "Cache-Control": "no-store"})
        await resp.prepare(request)
        await resp.write(_csv([], header=True))
        periods: dict[uuid.UUID, focus.BillingPeriod] = {}
        batch: list[dict] = []
        async for r in conn.cursor(_FOCUS_ROWS, tenant_id, start, end, prefetch=500):
            t = r["tenant_id"]
            if t not in periods:
                periods[t] = focus.BillingPeriod(start, end, str(t), r["tenant_name"] or str(t),
                                                 invoice_id=str(invoices[t]) if t in invoices else None)
            try:
                batch.append(focus.focus_row(focus_line(r, periods[t]), periods[t]))
            except PricingError as exc:     # nothing billing publishes should get here: logged, left out
                log.error("focus.row_refused", usage_key=r["usage_key"], field=exc.field, error=str(exc))
            if len(batch) >= 500:
                await resp.write(_csv(batch, header=False))
                batch = []
        if batch:
            await resp.write(_csv(batch, header=False))
    await resp.write_eof()
    return resp


# --- the billing ledger, verified by billing ----------------------------------------------------------------------

async def verify_ledger(request: web.Request) -> web.Response:
    """Billing recomputes its ledger's chain and checkpoints and answers; 200 whether intact or not (``ok``)."""
    p = require_provider_admin(request)
    gw = gateway_of(request)
    with answered("billing", "billing", "the ledger cannot be verified now", "verify its ledger",
                  timeout_s=LEDGER_VERIFY_TIMEOUT_S, retry_after_s=30):
        result = await rpc.request(gw.rt.broker.connection, gw.rt.catalog, "gateway", "billing.verify_ledger",
                                   bc.VerifyLedger(requested_by=p.user_id), timeout=LEDGER_VERIFY_TIMEOUT_S)
    if not result.ok:
        log.error("billing.ledger_broken", user_id=str(p.user_id), first_bad_seq=result.first_bad_seq,
                  bad_checkpoint=result.bad_checkpoint, reason=result.reason)
    return respond(LedgerVerificationOut(
        table="billing.ledger_entries", ok=result.ok, entries=result.entries, checkpoints=result.checkpoints,
        first_bad_seq=result.first_bad_seq, bad_checkpoint=result.bad_checkpoint, reason=result.reason,
        duration_ms=result.duration_ms, verified_at=result.at))


_PRICE_LIST = StateReader(select_object("price_lists_view", "version = $1", "currency", "effective_from", "body",
                                        "published_by", "published_at"), plain("version"))


ENDPOINTS = [
    Endpoint("PUT", "/v1/price-lists/{version}", put_price_list, "putPriceList",
             "Publish a price-list version (provider admin)", "billing", {202: PriceListAccepted},
             body=PriceListPut, params=(VERSION,), errors=(400, 401, 403, 409, 413, 415, 422),
             description="Prices in integer micros per GPU-hour / GB-hour. A version already in force cannot change "
                         "(409; publish a new version), none may take effect in the past (422). Billing stores it "
                         "or refuses it; GET /v1/price-lists shows which.",
             audit_state=_PRICE_LIST),
    Endpoint("GET", "/v1/price-lists", list_price_lists, "listPriceLists", "List the price-list versions", "billing",
             {200: PriceListList}, errors=(401,),
             description="Every published version, oldest first, and which one is in force now; provider admins "
                         "also see billing's latest refusals."),
    Endpoint("GET", "/v1/usage", get_usage, "getUsage", "Read rated usage", "billing", {200: UsageReport},
             params=(FROM, TO, GROUP_BY, TENANT), errors=(401, 404, 422),
             description="GPU-seconds, GB-hours and the rated amounts (integer minor units, per currency) of usage "
                         "records starting in [from, to) (empty when from >= to). A running meter's usage appears every "
                         "TESSERA_BILLING_CUT_S and at its stop, cut at UTC hours. Members read their own tenant's; "
                         "provider admins any (tenant_id) or all."),
    Endpoint("GET", "/v1/focus", export_focus, "exportFocus", "A month's usage as a FOCUS 1.2 CSV file", "billing",
             {200: TEXT_CSV}, params=(FOCUS_PERIOD, FOCUS_TENANT), errors=(401, 403, 404, 422),
             headers={200: {"Content-Disposition": "attachment; filename=focus-<tenant id|provider>-<YYYY-MM>.csv",
                            "Tessera-Unrated-Records": "How many of the period's usage records are unrated (no "
                                                       "price list was in force) and therefore not in the file."}},
             description="text/csv (FOCUS 1.2 columns, then x_ columns): the period's rated usage (records "
                         "starting in the month) and the corrections billed on its invoices (late usage of a "
                         "finalized period: ChargeCategory Adjustment, ChargeClass Correction, with its original "
                         "charge period). Tenant admins get their tenant's file; provider admins a tenant's "
                         "(tenant_id) or the provider-wide one; tenant users are refused (403)."),
    Endpoint("GET", "/v1/ops/ledger/verify", verify_ledger, "verifyBillingLedger",
             "Have billing recompute its ledger's hashes and checkpoints (provider admin)", "ops",
             {200: LedgerVerificationOut}, errors=(401, 403, 502, 503, 504),
             description="Asks the billing service (it reads its whole ledger; up to 60 s). 200 with ok true or "
                         "false (first_bad_seq / bad_checkpoint name what does not match); 503 at once when no "
                         "billing process is connected, 504 when it does not answer in time, 502 when it fails to "
                         "verify."),
]
