"""The policies in force in this process: the Cedar schema of the route table it serves, and the compiled
policies (the defaults and the stored ones), cached and reloaded (see http/policy.py for when)."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import asyncpg
import cedarpy
import structlog

from ..adapters import policies as repo
from ..domain import policy as domain
from ..domain.policy import Policy, PolicyBook
from .endpoint import Endpoint

log = structlog.get_logger()

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
NOT_JUDGED = frozenset({"createToken", "createPolicy", "replacePolicy", "deletePolicy", "evaluatePolicy"})
POLICY_TTL_S = 30.0


def mutating_endpoints(endpoints: list[Endpoint]) -> dict[str, Endpoint]:
    """The judged operations of ``endpoints``, by operationId."""
    return {e.operation_id: e for e in endpoints if e.method in MUTATING and e.operation_id not in NOT_JUDGED}


class PolicySchema:
    """The Cedar schema of a route table (``judged``: its judged operations), and the default provider policies
    (built on first use)."""

    def __init__(self, endpoints: list[Endpoint]):
        self.judged = mutating_endpoints(endpoints)
        self._built: tuple[str, cedarpy.Schema, list[Policy]] | None = None

    def get(self) -> tuple[str, cedarpy.Schema, list[Policy]]:
        if self._built is None:
            ops = [domain.operation(e.operation_id, e.tag) for e in self.judged.values()]
            text = domain.schema_text(ops)
            schema = cedarpy.Schema.from_str(text)
            self._built = (text, schema, domain.load_defaults(schema))
        return self._built


def stored_policy(row) -> Policy:
    """A stored policy row as the book holds it (its text was checked when stored)."""
    return Policy(str(row["id"]), row["scope"], row["tenant_id"], domain.parse_one(row["text"]))


class PolicyCache:
    """The compiled policies of this process: reloaded from the database (``pool()``) when invalidated or older
    than ttl_s."""

    def __init__(self, schema: PolicySchema, pool: Callable[[], asyncpg.Pool], ttl_s: float = POLICY_TTL_S):
        self.schema, self.pool, self.ttl_s = schema, pool, ttl_s
        self._book: PolicyBook | None = None
        self._loaded_at = 0.0
        self._generation = 0
        self._lock = asyncio.Lock()

    def invalidate(self) -> None:
        self._generation += 1
        self._book = None

    async def book(self) -> PolicyBook:
        book = self._book
        if book is not None and time.monotonic() - self._loaded_at < self.ttl_s:
            return book
        async with self._lock:
            if self._book is not None and time.monotonic() - self._loaded_at < self.ttl_s:
                return self._book
            generation, started = self._generation, time.monotonic()
            async with self.pool().acquire() as conn:
                rows = await repo.enabled(conn)
            _, schema, defaults = self.schema.get()
            book = PolicyBook(schema, defaults + [stored_policy(r) for r in rows])
            if generation == self._generation:   # no change was announced while reading: keep it
                self._book, self._loaded_at = book, started
            return book

    async def on_change(self, msg) -> None:
        """A ``gateway.policy_changed``, heard by every replica (Runtime.listen): drop the cache."""
        self.invalidate()
        log.debug("gateway.policies_invalidated", subject=msg.subject)
