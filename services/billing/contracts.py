"""Wire contract of the billing service: meters per allocation, price lists, rated usage, ledger checkpoints.

Prices are integer micros (millionths of the currency's major unit) per GPU-hour or per GB-hour
(services/billing/domain/pricing.py); amounts are integer minor units; quantities are decimal strings
(GPU-seconds, byte-seconds), so no float ever reaches a price or the ledger."""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from pydantic import Field

from shared.contract import Message, ServiceContract
from shared.steps import Step
from shared.wire import StepCommand, StepFailure, StepReply, StepUndone, UndoCommand, Wire

from .domain.pricing import ImmutableVersionError, PriceList, PricingError
from .domain.usage import version_from_doc

VERSION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
SELECTOR = Field(default=None, min_length=1, max_length=64)


class StartMeter(StepCommand):
    shape: str
    gpu_count: int
    user_id: uuid.UUID | None = None
    gpu_model: str | None = Field(default=None, max_length=64, description="The reserved GPUs' model.")
    pool: str | None = Field(default=None, max_length=64, description="The pool the slots were reserved in.")
    spot: bool = False


class MeterStarted(StepReply):
    meter_id: uuid.UUID
    started_at: datetime


class MeterStartFailed(StepFailure):
    pass


class StopMeter(UndoCommand):
    pass


class MeterStopped(StepUndone):
    meter_id: uuid.UUID | None = None
    gpu_seconds: float = 0.0


START_METER = Step.declare(
    "billing",
    command=("start_meter", StartMeter, "Saga step: start metering the allocation."),
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


@dataclass(frozen=True)
class PriceListProblem:
    field: str
    message: str
    immutable: bool     # the version is already in force (a conflict, not an invalid document)


def check_price_list(doc: dict, published: list[dict], now: datetime) -> PriceListProblem | None:
    """Billing's own rules for publishing the version ``doc`` (a PriceListDoc as a dict, effective_from a
    datetime) at ``now`` over the versions ``published`` (the same shape): None when it may be published, else
    what is wrong (domain.pricing: field rules, an effective version is immutable, nothing takes effect in the
    past). Pure: the gateway checks a request with it before it sends the command; billing checks again
    against its own store (handlers.rating.publish_price_list)."""
    try:
        PriceList("tessera", tuple(version_from_doc(p) for p in published)).publish(version_from_doc(doc), now)
    except PricingError as exc:
        return PriceListProblem(exc.field, str(exc), isinstance(exc, ImmutableVersionError))
    return None



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
    ],
    receives=["billing.publish_price_list", "storage.volume_changed", "storage.usage_reported"],
    steps=[START_METER],
)
