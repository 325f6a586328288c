"""The billing ledger (``ledger_entries``, schema/0002_ledger.sql) over shared.ledger_store, on the unit of
work's connection (the caller owns the transaction; the append lock is held until it commits).

Every rated usage record goes through here (handlers/rating.py): one entry per record, idempotently by its
source (``source_event``); usage that arrives after its period closed is a ``correction`` entry, never a
change to an old one (the table refuses UPDATE and DELETE)."""
from __future__ import annotations

import uuid
from typing import Any, NamedTuple

import asyncpg

from shared import ledger_store
from shared.ledger_store import Appended, Checkpoint, VerifyResult

TABLE = "ledger_entries"
KINDS = ("charge", "correction")


class Charge(NamedTuple):
    """One ledger entry to append (the columns the store does not set)."""
    tenant_id: uuid.UUID
    kind: str
    source_event: str
    amount_minor: int
    currency: str
    entry: dict[str, Any]


class PgLedger:
    def __init__(self, conn: asyncpg.Connection):
        self.conn = conn

    async def record(self, *, tenant_id: uuid.UUID, kind: str, source_event: str, amount_minor: int,
                     currency: str, entry: dict[str, Any]) -> Appended:
        """Append the entry rating ``source_event`` unless one is already there (then that one is returned).
        ``amount_minor`` is in integer minor units; ``entry`` holds no floats (shared/chain.py)."""
        [appended] = await self.record_many([Charge(tenant_id, kind, source_event, amount_minor, currency, entry)])
        return appended

    async def record_many(self, charges: list[Charge]) -> list[Appended]:
        """``record`` for each charge, in order, as one append (one lock, one insert): the ledger's lock
        serialises every rating transaction, so a batch pays for it once."""
        for ch in charges:
            if ch.kind not in KINDS:
                raise ValueError(f"kind must be one of {KINDS}, got {ch.kind!r}")
        return await ledger_store.append_many(self.conn, TABLE, [ch._asdict() for ch in charges],
                                              unique="source_event")

    async def checkpoint(self) -> Checkpoint | None:
        return await ledger_store.checkpoint(self.conn, TABLE)

    async def verify(self) -> VerifyResult:
        return await ledger_store.verify(self.conn, TABLE)
