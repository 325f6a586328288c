"""What an update or delete acted on, as the gateway's own tables and views show it (asyncpg): every PUT, PATCH and
DELETE operation of contracts/openapi.json declares a state reader (its Endpoint's ``audit_state``, next to its
handler in its api/ slice), so the audit middleware (http/audit.py) can record the target's state before and
after the request. This module is what the readers are made of.

A reader is one SELECT of a ``jsonb_build_object`` naming only what describes the target (a quota's limits, a
node's status, cordon and labels, a volume's size and state, a budget's amount, thresholds and webhook url…),
never a secret: a BMC's sealed password and CA bundle, a budget's webhook secret and key hashes are not selected
(and the middleware passes every state through domain.audit.redact anyway). It answers the JSON-ready state, or
None when there is none (no such row, or a path value that cannot name one: a malformed uuid). Readers only read,
may block on the database, and raise whatever asyncpg raises.

Many commands are asynchronous (202: the view changes when the owning service's event arrives), so right after
such a request ``after`` may still equal ``before``; the recorded request body is the requested state.
"""
from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import asyncpg

from ..domain.audit import storable

NIL = uuid.UUID(int=0)   # quotas_view / volume_quotas_view: the tenant's own row (no user)

Args = Callable[[dict[str, str], Any], tuple | None]


@dataclass(frozen=True)
class StateReader:
    """``sql`` selects one jsonb value (the state) from ``args(path params, principal)``; args None: no target."""
    sql: str
    args: Args

    async def __call__(self, conn: asyncpg.Connection, params: dict[str, str], principal) -> dict | None:
        try:
            values = self.args(params, principal)
        except (KeyError, ValueError, AttributeError):   # a malformed uuid, or no principal: it names nothing
            return None
        if values is None or any(isinstance(v, str) and storable(v) != v for v in values):
            return None   # a NUL or lone surrogate (hostile input) names no row and PostgreSQL refuses it
        state = await conn.fetchval(self.sql, *values)
        return json.loads(state) if isinstance(state, str) else state


def ids(*names: str) -> Args:
    """The path parameters ``names``, as uuids."""
    return lambda params, _principal: tuple(uuid.UUID(params[n]) for n in names)


def plain(*names: str) -> Args:
    """The path parameters ``names``, as they are."""
    return lambda params, _principal: tuple(params[n] for n in names)


def select_object(table: str, where: str, *members: str) -> str:
    """A SELECT of one jsonb object of ``members`` (columns; a quoted one keeps its quotes in SQL only)."""
    pairs = ", ".join(f"'{m.strip(chr(34))}', {m}" for m in members)
    return f"SELECT jsonb_build_object({pairs}) FROM {table} WHERE {where}"
