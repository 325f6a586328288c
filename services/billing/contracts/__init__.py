"""Wire contract of the billing service: meters per allocation, price lists, rated usage, ledger checkpoints.

Prices are integer micros (millionths of the currency's major unit) per GPU-hour or per GB-hour
(services/billing/domain/pricing.py); amounts are integer minor units; quantities are decimal strings
(GPU-seconds, byte-seconds), so no float ever reaches a price or the ledger. The pricing rules other services
apply with billing's own code are in ``contracts.pricing``."""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import Literal

from pydantic import Field

from shared.contract import Message, ServiceContract
from shared.steps import Step
from shared.wire import StepCommand, StepFailure, StepReply, StepUndone, UndoCommand, Wire

VERSION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
SELECTOR = Field(default=None, min_length=1, max_length=64)


class PriceSnapshot(Wire):
    """The GPU-hour price an allocation was quoted when it was created (gateway, from the price list in force),
    carried with the request to billing, which rates the allocation's GPU usage with it for its whole life."""
    price_list_version: str = Field(max_length=64)
    currency: str = Field(pattern=r"^[A-Z]{3}$", examples=["USD"])
    micros_per_gpu_hour: int = Field(ge=0, le=10**15, description="List (on-demand) price per GPU-hour.")
    spot_discount_bps: int = Field(default=0, ge=0, le=10_000)
    spot: bool = False
    sku_id: str = Field(max_length=300)
    gpu_count: int = Field(ge=1, le=64)
    hourly_amount: str = Field(max_length=40, description="Exact price of one hour of all its GPUs, major units "
                                                          "(spot discount applied), e.g. '7.2'.")
    quoted_at: datetime


class MeterTerms(Wire):
    """What billing prices an allocation's usage by, besides its shape and GPUs: the user, where the slots were
    reserved, spot, and the price quoted at creation (``allocation.activated`` carries them, as ``start_meter``
    did)."""
    user_id: uuid.UUID | None = None
    gpu_model: str | None = Field(default=None, max_length=64, description="The reserved GPUs' model.")
    pool: str | None = Field(default=None, max_length=64, description="The pool the slots were reserved in.")
    spot: bool = False
    price: PriceSnapshot | None = Field(default=None, description="The price quoted at creation; none: the "
                                                                  "price list in force at each hour applies.")


class StartMeter(StepCommand, MeterTerms):
    shape: str
    gpu_count: int


class MeterStarted(StepReply):
    meter_id: uuid.UUID
    started_at: datetime


class MeterStartFailed(StepFailure):
    pass


class StopMeter(UndoCommand):
    at: datetime | None = Field(default=None, description=(
        "When usage ends: the moment the tenant lost the allocation (a reschedule pauses the meter at the "
        "interruption, never later than now); none: now. Never before the usage already recorded."))


class MeterStopped(StepUndone):
    meter_id: uuid.UUID | None = None
    gpu_seconds: float = 0.0


START_METER = Step.declare(
    "billing",
    command=("start_meter", StartMeter, "Start metering the allocation (sent by sagas started before billing metered "
                                        "allocation.activated; none sends it now)."),
    ok=("meter_started", MeterStarted, "The meter runs."),
    failed=("meter_start_failed", MeterStartFailed, "The meter could not be started."),
    undo=("stop_meter", StopMeter, "Saga step or compensation: stop the allocation's meter (idempotent)."),
    undone=("meter_stopped", MeterStopped, "The meter is stopped; GPU-seconds recorded."),
)


class GpuHourPrice(Wire):
    """Micros per GPU-hour for usage its selectors match (none: the default price)."""
    micros_per_gpu_hour: int = Field(ge=0, le=10**15)
    shape: str | None = SELECTOR
    gpu_model: str | None = SELECTOR
    pool: str | None = SELECTOR


class PriceListDoc(Wire):
    """One price-list version as published."""
    version: str = Field(pattern=VERSION_PATTERN)
    currency: str = Field(pattern=r"^[A-Z]{3}$", examples=["USD"])
    effective_from: datetime
    gpu_hour: list[GpuHourPrice] = Field(default_factory=list, max_length=1000)
    gb_hour: dict[str, int] = Field(default_factory=dict, description="Storage class -> micros per GB-hour.")
    spot_discount_bps: int = Field(default=0, ge=0, le=10_000)


class PublishPriceList(PriceListDoc):
    requested_by: uuid.UUID


class PriceListPublished(PriceListDoc):
    published_by: uuid.UUID
    published_at: datetime


class PriceListRejected(Wire):
    version: str
    reason: str = Field(max_length=2000)
    field: str | None = None
    requested_by: uuid.UUID
    at: datetime


class UsageRated(Wire):
    """One usage record and its rating (the ledger entry ``ledger_seq`` holds it). ``usage_key`` is unique:
    ``<source>:<event_id>``. GPU usage: ``quantity`` is GPU-seconds; storage: byte-seconds."""
    usage_key: str
    kind: Literal["gpu", "storage"]
    tenant_id: uuid.UUID
    user_id: uuid.UUID | None = None
    allocation_id: uuid.UUID | None = None
    volume_id: uuid.UUID | None = None
    shape: str | None = None
    gpu_model: str | None = None
    pool: str | None = None
    spot: bool = False
    storage_class: str | None = None
    period_start: datetime
    period_end: datetime
    quantity: str = Field(description="Exact decimal: GPU-seconds (gpu) or byte-seconds (storage).")
    amount_minor: int
    currency: str
    rated: bool
    price_list_version: str | None = None
    sku_price_id: str | None = None
    reason: str | None = Field(default=None, description="Why an unrated record carries no amount.")
    ledger_seq: int
    list_amount_minor: int = Field(default=0, description="The amount at list (on-demand) price; equal to "
                                                          "amount_minor unless spot.")
    micros_per_unit_hour: int | None = Field(default=None, description="List price per GPU-hour or GB-hour.")
    invoice_id: uuid.UUID | None = Field(default=None, description="The invoice the record was billed on.")
    correction: bool = Field(default=False, description="Late usage of a finalized period, billed as a "
                                                        "correction line on a later invoice.")


class Amount(Wire):
    currency: str
    amount_minor: int


class UsageRolledUp(Wire):
    """A tenant's usage totals for one UTC hour so far (sent again whenever that hour's totals change: the
    latest per (tenant_id, hour) is current)."""
    tenant_id: uuid.UUID
    hour: datetime
    gpu_seconds: str
    byte_seconds: str
    amounts: list[Amount]
    records: int
    at: datetime


class InvoiceLine(Wire):
    line_key: str = Field(description="Stable within the invoice: what the line sums (kind, SKU, price, "
                                      "correction).")
    description: str
    kind: Literal["gpu", "storage"]
    correction: bool = False
    corrects_period: str | None = Field(default=None, description="The finalized period (YYYY-MM) late usage "
                                                                  "belongs to.")
    sku_price_id: str | None = None
    price_list_version: str | None = None
    unit: str = Field(description="'GPU-hours' or 'GB-hours'.")
    quantity: str = Field(description="Exact decimal, in unit.")
    amount_minor: int
    currency: str
    entries: int = Field(description="Ledger entries the line sums.")


class InvoiceDoc(Wire):
    """One invoice as billing holds it: ``draft`` while its period runs and during the grace period, then
    ``finalized`` and never changed again. ``version`` grows with every change."""
    invoice_id: uuid.UUID
    number: str = Field(description="Human-readable: TSR-<YYYYMM>-<tenant prefix>.")
    tenant_id: uuid.UUID
    period_start: datetime
    period_end: datetime
    grace_until: datetime
    status: Literal["draft", "finalized"]
    totals: list[Amount]
    lines: list[InvoiceLine]
    entries: int
    ledger_sum: list[Amount] = Field(description="Sum of the invoice's ledger entries per currency (equals totals).")
    finalized_at: datetime | None = None
    content_hash: str | None = Field(default=None, description="SHA-256 of the finalized document's canonical "
                                                               "JSON (lines and totals).")
    version: int
    updated_at: datetime


class InvoiceChanged(Wire):
    invoice: InvoiceDoc


class BudgetThreshold(Wire):
    percent: int = Field(ge=1, le=1000)
    basis: Literal["actual", "forecast"] = "actual"


class SetBudget(Wire):
    """A tenant's monthly budget (replaces the previous one; thresholds already crossed this month are not sent
    again)."""
    tenant_id: uuid.UUID
    amount_minor: int = Field(ge=1, le=10**15)
    currency: str = Field(pattern=r"^[A-Z]{3}$", examples=["USD"])
    thresholds: list[BudgetThreshold] = Field(min_length=1, max_length=10)
    webhook_url: str | None = Field(default=None, max_length=2048)
    webhook_secret: str | None = Field(default=None, min_length=16, max_length=256,
                                       description="HMAC-SHA256 key of the webhook's signature.")
    requested_by: uuid.UUID


class DeleteBudget(Wire):
    tenant_id: uuid.UUID
    requested_by: uuid.UUID


class CrossedThreshold(Wire):
    percent: int
    basis: Literal["actual", "forecast"]
    at: datetime


class BudgetChanged(Wire):
    """A tenant's budget and this month's standing (``amount_minor`` None: the budget was deleted)."""
    tenant_id: uuid.UUID
    amount_minor: int | None
    currency: str | None
    thresholds: list[BudgetThreshold]
    webhook_url: str | None
    period_start: datetime
    spend_minor: int
    forecast_minor: int
    crossed: list[CrossedThreshold]
    version: int
    at: datetime


class BudgetThresholdCrossed(Wire):
    tenant_id: uuid.UUID
    period_start: datetime
    period_end: datetime
    percent: int
    basis: Literal["actual", "forecast"]
    budget_minor: int
    spend_minor: int
    forecast_minor: int
    currency: str
    at: datetime


class WebhookDeliveryChanged(Wire):
    """A webhook call's state: ``pending`` (will be tried at next_attempt_at), ``delivered`` (a 2xx answer) or
    ``failed`` (attempts exhausted)."""
    delivery_id: uuid.UUID
    tenant_id: uuid.UUID
    event: str = Field(description="What is delivered, e.g. 'budget.threshold_crossed'.")
    url: str
    status: Literal["pending", "delivered", "failed"]
    attempts: int
    last_status: int | None = None
    last_error: str | None = Field(default=None, max_length=500)
    next_attempt_at: datetime | None = None
    delivered_at: datetime | None = None
    at: datetime


class VerifyLedger(Wire):
    requested_by: uuid.UUID


class LedgerVerification(Wire):
    """The billing ledger recomputed: chain and checkpoints (shared.ledger_store.verify)."""
    ok: bool
    entries: int
    checkpoints: int
    first_bad_seq: int | None = None
    bad_checkpoint: int | None = None
    reason: str | None = None
    duration_ms: float
    at: datetime


class LedgerCheckpointed(Wire):
    tree_size: int
    first_seq: int
    last_seq: int
    root_hash: str = Field(description="RFC 6962 Merkle root over the ledger's row hashes, hex.")
    at: datetime


CONTRACT = ServiceContract(
    service="billing",
    title="Tessera billing service",
    description="Meters allocations and storage, rates usage with the price list in force, appends every "
                "rating to a hash-chained ledger and publishes its Merkle checkpoints.",
    messages=[
        Message("billing.publish_price_list", "billing.cmd.publish_price_list", PublishPriceList, "command",
                "Publish (or reschedule, while not yet effective) a price-list version."),
        Message("billing.price_list_published", "billing.evt.price_list_published", PriceListPublished, "event",
                "A price-list version is stored; it applies from its effective_from."),
        Message("billing.price_list_rejected", "billing.evt.price_list_rejected", PriceListRejected, "event",
                "A price-list version was refused (invalid, or it would change an effective version)."),
        Message("billing.usage_rated", "billing.evt.usage_rated", UsageRated, "event",
                "A usage record was metered, rated and appended to the ledger (once per usage key)."),
        Message("billing.ledger_checkpointed", "billing.evt.ledger_checkpointed", LedgerCheckpointed, "event",
                "A Merkle checkpoint over the ledger (tree size, root hash), to be kept outside its database."),
        Message("billing.usage_rolled_up", "billing.evt.usage_rolled_up", UsageRolledUp, "event",
                "A tenant's usage totals of one UTC hour so far (for dashboards; the latest per hour is current)."),
        Message("billing.invoice_changed", "billing.evt.invoice_changed", InvoiceChanged, "event",
                "An invoice as it stands (draft, growing; or finalized, never to change)."),
        Message("billing.set_budget", "billing.cmd.set_budget", SetBudget, "command",
                "Set a tenant's monthly budget, its thresholds and its webhook."),
        Message("billing.delete_budget", "billing.cmd.delete_budget", DeleteBudget, "command",
                "Delete a tenant's budget."),
        Message("billing.budget_changed", "billing.evt.budget_changed", BudgetChanged, "event",
                "A tenant's budget and this month's spend and forecast (none: deleted)."),
        Message("billing.budget_threshold_crossed", "billing.evt.budget_threshold_crossed", BudgetThresholdCrossed,
                "event", "A tenant's actual or forecast spend crossed a threshold of its budget (once per month)."),
        Message("billing.webhook_delivery_changed", "billing.evt.webhook_delivery_changed", WebhookDeliveryChanged,
                "event", "A webhook call was made, retried, delivered or given up."),
        Message("billing.verify_ledger", "billing.rpc.verify_ledger", VerifyLedger, "request",
                "Recompute the billing ledger's chain and checkpoints now.", reply=LedgerVerification),
    ],
    receives=["billing.publish_price_list", "billing.set_budget", "billing.delete_budget", "storage.volume_changed",
              "storage.usage_reported", "allocation.activated", "allocation.failed"],
    steps=[START_METER],
)
