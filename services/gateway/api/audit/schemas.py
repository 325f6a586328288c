"""HTTP models of the audit trail: a record (with its CADF and Kubernetes renderings), a page of them, and what
a verification of the chain found."""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from ...http.schema_base import Out


class AuditRecord(Out):
    """One audited mutating request (docs/audit.md describes every member)."""

    seq: int = Field(description="Position in the hash chain (1, 2, 3 … without gaps).")
    audit_id: uuid.UUID
    event_time: datetime = Field(description="When the gateway received the request.")
    recorded_at: datetime = Field(description="When the record was written (after the handler ran).")
    tenant_id: uuid.UUID | None = Field(description="The actor's tenant, else the tenant the path names.")
    user_id: uuid.UUID | None = Field(description="The authenticated user; null for an unauthenticated request.")
    role: str | None
    action: str = Field(description="The operationId of the route.")
    method: Literal["POST", "PUT", "PATCH", "DELETE", "GET"] = Field(description="GET: an audited read (a console, an export).")
    path: str
    target_type: str
    target_id: str | None
    outcome: Literal["success", "failure", "unknown"]
    status: int = Field(description="The HTTP status answered.")
    request_id: str = Field(description="The request's trace id (OpenTelemetry, 32 hex digits).")
    record: dict[str, Any] = Field(description="The internal record: actor, target, outcome, request, observer.")
    row_hash: str = Field(description="The record's chain hash (hex).")
    cadf: dict[str, Any] = Field(description="The record as a CADF event.")
    k8s: dict[str, Any] = Field(description="The record as a Kubernetes audit.k8s.io/v1 Event.")


class AuditPage(Out):
    """One page of audit records, newest first."""

    items: list[AuditRecord]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next (older) page; null on the last page.")


class AuditVerification(Out):
    """What recomputing the audit chain found (shared.ledger_store.verify)."""

    table: str
    ok: bool
    entries: int
    last_seq: int | None
    head_hash: str | None
    checkpoints: int
    bad_entry_count: int
    bad_checkpoint_count: int
    first_bad_entry: dict[str, Any] | None = Field(description="The first bad row: its seq and what is wrong.")
    first_bad_checkpoint: dict[str, Any] | None
    bad_entries: list[int] = Field(description="The seqs of the first bad rows (at most 100).")
    bad_checkpoints: list[int]
