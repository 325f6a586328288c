"""Price lists and usage.

``PUT /v1/price-lists/{version}`` (provider admin) validates the version with billing's own pure rules
(services.billing.domain: the version's fields, and against the versions this gateway has seen: an effective
version is immutable, none takes effect in the past) and sends ``billing.publish_price_list``; billing checks
again against its own store and publishes the version or its refusal, which ``GET /v1/price-lists`` shows.

``GET /v1/usage`` reads usage_view, which the gateway projects from ``billing.usage_rated`` (one row per usage
record). A projection rather than a request/reply to billing: the gateway already answers every read from its
own views, tenant scoping is one SQL condition, and a read never waits on billing being up.
"""
from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Literal

from aiohttp import web

from services.billing.contracts import VERSION_PATTERN, PublishPriceList, check_price_list

from ..http.auth import principal_of, require_provider_admin
from ..http.endpoint import Endpoint, Param, respond
from ..http.inputs import path_value, query_value, read_body
from ..http.problems import ProblemError, validation_problem
from ..http.schemas.base import FieldError, text
from ..http.schemas.base import Instant
from ..http.schemas.billing import (GpuPriceOut, PriceListAccepted, PriceListList, PriceListOut, PriceListPut,
                                    PriceListRejectionOut, UsageGroupOut, UsageReport)
from ..http.state import gateway_of

VERSION = Param("version", "path", "The version's id (letters, digits, '.', '_', '-').",
                text(64, min_length=1, pattern=VERSION_PATTERN), required=True)
FROM = Param("from", "query", "Usage from this instant on (RFC 3339; default: 30 days before `to`).", Instant)
TO = Param("to", "query", "Usage before this instant (RFC 3339; default: now).", Instant)
GROUP_BY = Param("group_by", "query", "Group the usage by this.", Literal["shape", "gpu_model", "pool", "day", "hour"])
TENANT = Param("tenant_id", "query", "Whose usage (provider admins; members always read their own tenant's).",
               uuid.UUID)
_WIRE_FIELDS = {"gpu_hour": "gpu_prices", "micros_per_gpu_hour": "gpu_prices", "gb_hour": "storage_prices",
                "storage_class": "storage_prices", "micros_per_gb_hour": "storage_prices"}   # domain → API names
_GROUPS = {"shape": "shape", "gpu_model": "gpu_model", "pool": "pool",
           "day": "to_char(date_trunc('day', period_start, 'UTC'), 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')",
           "hour": "to_char(date_trunc('hour', period_start, 'UTC'), 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')"}


def _body(row) -> dict:
    return json.loads(row["body"]) if isinstance(row["body"], str) else dict(row["body"])


def _check(doc: dict, rows: list, now: datetime) -> None:
    """Billing's rules (contracts.check_price_list), here first, over the versions this gateway has seen: a 422
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
        _check(doc, rows, datetime.now(timezone.utc))
        await uow.emit("billing.publish_price_list", PublishPriceList(**doc, requested_by=admin.user_id),
                       correlation_id=f"price-list:{version}")
    return respond(PriceListAccepted(version=version, status="publishing"), 202)


async def list_price_lists(request: web.Request) -> web.Response:
    caller = principal_of(request)
    now = datetime.now(timezone.utc)
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
    end = query_value(request, TO) or datetime.now(timezone.utc)
    start = query_value(request, FROM) or end - timedelta(days=30)
    group_by = query_value(request, GROUP_BY)
    if start >= end:
        raise validation_problem([FieldError(field="from", message="must be before `to`", code="empty_interval")])
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


ENDPOINTS = [
    Endpoint("PUT", "/v1/price-lists/{version}", put_price_list, "putPriceList",
             "Publish a price-list version (provider admin)", "billing", {202: PriceListAccepted},
             body=PriceListPut, params=(VERSION,), errors=(400, 401, 403, 409, 413, 415, 422),
             description="Prices in integer micros per GPU-hour / GB-hour. A version already in force cannot change "
                         "(409; publish a new version), none may take effect in the past (422). Billing stores it "
                         "or refuses it; GET /v1/price-lists shows which."),
    Endpoint("GET", "/v1/price-lists", list_price_lists, "listPriceLists", "List the price-list versions", "billing",
             {200: PriceListList}, errors=(401,),
             description="Every published version, oldest first, and which one is in force now; provider admins "
                         "also see billing's latest refusals."),
    Endpoint("GET", "/v1/usage", get_usage, "getUsage", "Read rated usage", "billing", {200: UsageReport},
             params=(FROM, TO, GROUP_BY, TENANT), errors=(401, 404, 422),
             description="GPU-seconds, GB-hours and the rated amounts (integer minor units, per currency) of usage "
                         "records starting in [from, to). A meter's usage appears when it stops, one record per "
                         "UTC hour. Members read their own tenant's; provider admins any (tenant_id) or all."),
]
