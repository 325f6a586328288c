"""Billing's public pricing rules: the rules other services apply with billing's own code, pure and exact (a
service may import only another's contracts). The gateway checks a price list before it sends it
(``check_price_list``), quotes a new allocation (``quote_gpu_hour``), renders its FOCUS export (``focus``) and
shows amounts in a currency's minor units (``currency_exponent``); billing applies the same rules again to what
it stores and rates."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from ..domain import focus
from ..domain.pricing import (
    ImmutableVersionError,
    NoPriceError,
    PriceList,
    PricingError,
    currency_exponent,
    hourly_price,
    price_for,
)
from ..domain.usage import version_from_doc
from . import PriceSnapshot

__all__ = ["PriceListProblem", "PricingError", "check_price_list", "currency_exponent", "focus", "quote_gpu_hour"]


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


def quote_gpu_hour(doc: dict, *, shape: str, gpu_model: str | None, pool: str | None, spot: bool, gpus: int,
                   now: datetime) -> PriceSnapshot | None:
    """The GPU-hour price that version ``doc`` (a PriceListDoc as a dict, effective_from a datetime, in force at
    ``now``) gives an allocation of ``gpus`` GPUs of ``shape`` in ``pool``: billing's own precedence and exact
    amount (domain.pricing.price_for / hourly_price). None when nothing matches, and when the shape names no GPU
    model but a price by GPU model could apply (the model is known only once placed, so no price is promised).
    Pure: the gateway quotes a new allocation with it; billing rates the allocation with the snapshot."""
    try:
        version = version_from_doc(doc)
        listed = PriceList("tessera", (version,))
        unit = price_for(listed, shape, gpu_model, pool, spot, version.effective_from)
        hourly = hourly_price(listed, shape, gpu_model, pool, spot, gpus, version.effective_from)
    except (NoPriceError, PricingError):
        return None
    if gpu_model is None and not unit.sku_id.startswith("gpu-hour:shape=") and any(p.gpu_model for p in version.gpu_hour):
        return None
    return PriceSnapshot(price_list_version=version.version, currency=version.currency,
                         micros_per_gpu_hour=unit.micros_per_gpu_hour, spot_discount_bps=version.spot_discount_bps,
                         spot=spot, sku_id=unit.sku_id, gpu_count=gpus, hourly_amount=format(hourly.amount, "f"),
                         quoted_at=now)
