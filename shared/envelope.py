"""The one envelope every message on the bus travels in (CloudEvents-like, JSON).

Headers carry what NATS itself needs: ``Nats-Msg-Id`` (= envelope id, for the
server's duplicate window) and the W3C ``traceparent``/``tracestate``, and what a
consumer orders its work by without parsing the body: ``Tessera-Tenant`` and
``Tessera-Weight`` (``shared.fairness``); the body carries the envelope, so a
message read from any stream (or the dead-letter stream) is self-describing.
"""
from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .fairness import MAX_WEIGHT, TENANT_HEADER, WEIGHT_HEADER

MSG_ID_HEADER = "Nats-Msg-Id"
TYPE_HEADER = "Tessera-Type"


def utcnow() -> datetime:
    return datetime.now(UTC)


class Envelope(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: uuid.UUID = Field(description="Unique event id; also the Nats-Msg-Id and the inbox key.")
    type: str = Field(description="Message type, e.g. scheduler.slots_reserved.")
    schema_version: int = Field(ge=1)
    occurred_at: datetime
    tenant_id: uuid.UUID | None = None
    weight: int | None = Field(default=None, ge=1, le=MAX_WEIGHT, description=(
        "The tenant's share of each consumer's service while its messages wait with other tenants' (its plan, "
        "set by a provider admin); absent: 1. Inherited from the causing message, as the tenant is."))
    correlation_id: str = Field(description="The allocation (or saga) this message belongs to.")
    causation_id: uuid.UUID | None = Field(default=None, description="Id of the message that caused this one.")
    traceparent: str | None = None
    tracestate: str | None = None
    data: dict[str, Any]

    def headers(self) -> dict[str, str]:
        h = {MSG_ID_HEADER: str(self.id), TYPE_HEADER: self.type}
        if self.tenant_id is not None:
            h[TENANT_HEADER] = str(self.tenant_id)
        if self.weight is not None:
            h[WEIGHT_HEADER] = str(self.weight)
        if self.traceparent:
            h["traceparent"] = self.traceparent
        if self.tracestate:
            h["tracestate"] = self.tracestate
        return h
