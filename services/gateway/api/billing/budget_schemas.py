"""HTTP models of a tenant's budget, its webhook deliveries and the provider's spend cap. Amounts are integer minor
units (cents for USD); a budget is per calendar month (UTC)."""
from __future__ import annotations

import re
import uuid
from datetime import datetime
from typing import Annotated, ClassVar, Literal

from pydantic import ConfigDict, Field

from ...http.schema_base import Body, Explained, Out, integer, text

MAX_MINOR = 10**15
BudgetCurrency = text(3, min_length=3, pattern=r"^[A-Z]{3}$")
# http or https; a host (RFC 3986 reg-name, or an IPv6 literal), an optional port, then anything visible: no
# user:password@ before the host (the URL is shown to the tenant's admins and kept in views and logs; signing is
# webhook_secret's job). The server refuses exactly what this pattern refuses.
WEBHOOK_URL_PATTERN = (r"^https?://(?:[A-Za-z0-9._~%!$&'()*+,;=-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?"
                       r"(?:[/?#][!-~]*)?$")
WEBHOOK_SECRET_LENGTH = (16, 256)


def _url_problem(value: str) -> str | None:
    """Why a URL is refused, in words, where the pattern alone would be cryptic (None: the pattern decides)."""
    scheme, sep, rest = value.partition("://")
    if not sep or scheme not in ("http", "https"):
        return "must be an http:// or https:// URL"
    if "@" in re.split(r"[/?#]", rest, maxsplit=1)[0]:
        return "must not carry credentials (user:password@): calls are signed with webhook_secret"
    return None


WebhookUrl = Annotated[text(2048, min_length=1), Explained(WEBHOOK_URL_PATTERN, _url_problem, "webhook_url")]
WebhookSecret = text(WEBHOOK_SECRET_LENGTH[1], min_length=WEBHOOK_SECRET_LENGTH[0], pattern=r"^[ -~]+$")


class ThresholdIn(Body):
    percent: integer(1, 1000) = Field(description="Percent of the budget (above 100: overspend alerts).")
    basis: Literal["actual", "forecast"] = Field(default="actual", description="Compare the month's actual spend, "
                                                                             "or its forecast for the whole month.")


# a webhook_secret only with a webhook_url (the server refuses the one without the other with a 422)
_BUDGET_RULES = {"allOf": [
    {"if": {"properties": {"webhook_secret": {"type": "string"}}, "required": ["webhook_secret"]},
     "then": {"properties": {"webhook_url": {"type": "string"}}, "required": ["webhook_url"]}}]}


class BudgetSet(Body):
    """A tenant's monthly budget; replaces the previous one whole (its webhook secret included)."""

    model_config = ConfigDict(json_schema_extra=_BUDGET_RULES)
    server_owned: ClassVar[frozenset[str]] = frozenset(
        {"tenant_id", "has_webhook_secret", "spend_minor", "forecast_minor", "crossed", "version", "deliveries",
         "spend_cap"})
    amount_minor: integer(1, MAX_MINOR) = Field(description="The month's budget in minor units (cents for USD).")
    currency: BudgetCurrency = Field(description="ISO 4217 code; only rated usage in this currency counts.")
    thresholds: list[ThresholdIn] = Field(min_length=1, max_length=10, description="When to alert (each once a "
                                                                                   "month); a (percent, basis) listed "
                                                                                   "twice counts once.")
    webhook_url: WebhookUrl | None = Field(default=None, description="Called (POST, HMAC-SHA256 signed with the "
                                                                     "secret) when a threshold is crossed; http or "
                                                                     "https, no credentials in it, at most 2048 "
                                                                     "characters. null: no webhook.")
    webhook_secret: WebhookSecret | None = Field(
        default=None, description="16-256 printable ASCII characters, write-only (never returned, redacted in the "
                                  "audit trail). Left out with a webhook_url: the gateway generates one and returns "
                                  "it once in the 202. Only with a webhook_url.")


class ThresholdOut(Out):
    percent: int
    basis: Literal["actual", "forecast"]


class CrossingOut(Out):
    percent: int
    basis: Literal["actual", "forecast"]
    at: datetime
    spend_minor: int | None = Field(default=None, description="The spend when it was crossed (null: only billing's "
                                                              "standing says it was).")
    forecast_minor: int | None = None


class BudgetAccepted(Out):
    tenant_id: uuid.UUID
    amount_minor: int
    currency: str
    thresholds: list[ThresholdOut]
    webhook_url: str | None
    has_webhook_secret: bool
    webhook_secret: str | None = Field(default=None, description="Only when the gateway generated it: shown this once.")
    status: Literal["applying"] = Field(description="Billing applies it; GET …/budget shows it once it has.")


class BudgetDeleteAccepted(Out):
    tenant_id: uuid.UUID
    status: Literal["deleting"]


class BudgetOut(Out):
    """The budget as billing last published it, with this month's standing as billing computed it."""

    amount_minor: int
    currency: str
    thresholds: list[ThresholdOut]
    webhook_url: str | None
    has_webhook_secret: bool = Field(description="Whether calls are signed (the secret itself is never shown).")
    period_start: datetime = Field(description="The month the standing is of (UTC).")
    spend_minor: int = Field(description="The month's rated spend, as billing last reported it.")
    forecast_minor: int = Field(description="Billing's forecast of the whole month's spend.")
    version: int
    updated_at: datetime


class DeliveryOut(Out):
    delivery_id: uuid.UUID
    event: str
    url: str
    status: Literal["pending", "delivered", "failed"]
    attempts: int
    last_status: int | None = Field(description="The HTTP status of the last attempt (null: no answer).")
    last_error: str | None
    next_attempt_at: datetime | None
    delivered_at: datetime | None
    updated_at: datetime


class SpendCapSet(Body):
    server_owned: ClassVar[frozenset[str]] = frozenset({"tenant_id", "used_minor", "set_by", "set_at"})
    amount_minor: integer(0, MAX_MINOR) = Field(description="Refuse new allocations once the month's rated spend "
                                                            "reaches this (0: refuse every new one).")
    currency: BudgetCurrency = Field(description="ISO 4217 code; only rated usage in this currency counts.")


class SpendCapOut(Out):
    tenant_id: uuid.UUID
    amount_minor: int
    currency: str
    used_minor: int = Field(description="Month-to-date rated spend in the currency, from the gateway's usage view "
                                        "(usage appears when metered: a running allocation's hours once cut).")
    exceeded: bool = Field(description="Whether new allocations are refused now (used_minor >= amount_minor).")
    set_at: datetime


class BudgetView(Out):
    tenant_id: uuid.UUID
    budget: BudgetOut | None = Field(description="null: no budget (or billing has not applied it yet).")
    crossed: list[CrossingOut] = Field(description="Thresholds crossed this month (UTC), oldest first.")
    deliveries: list[DeliveryOut] = Field(description="The latest 50 webhook calls, newest first.")
    spend_cap: SpendCapOut | None = Field(description="The provider's cap on the tenant (null: none).")


