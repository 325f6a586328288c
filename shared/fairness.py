"""Fair service between tenants inside a consumer (pure; no I/O): deficit round robin over the tenants whose
messages are waiting, weighted.

A consumer (``shared.consumer``) keeps what it fetched and has not yet handed to a worker in a ``FairQueue``,
one line per tenant (read from the message's ``Tessera-Tenant`` header; messages without one form a line of
their own), and builds each batch with ``take``: every round, each waiting tenant may take as many messages as
its weight (``Tessera-Weight``, 1 by default), in the order they arrived. A tenant with a burst of a thousand
messages and one with a single message are served alternately, not one after the other; a tenant of weight 4
is served four messages for each one of a tenant of weight 1 while both have messages waiting. An idle tenant
builds up no credit: its deficit is dropped when its line empties.

The weights are the tenant's plan, set by a provider admin (``PATCH /v1/tenants/{id}``); the gateway
knows them (``TenantWeights``, filled from its table) and stamps each message it sends with its tenant's
weight; every message caused by one inherits it, as it inherits the tenant (``shared.outbox``).
"""
from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Iterator, Mapping
from typing import Generic, TypeVar

TENANT_HEADER = "Tessera-Tenant"
WEIGHT_HEADER = "Tessera-Weight"
DEFAULT_WEIGHT = 1
MAX_WEIGHT = 100
NO_TENANT = ""   # the line of messages that name no tenant (a node's heartbeats, the platform's own work)

T = TypeVar("T")


def clamp_weight(value: object) -> int:
    """A weight as the picker uses it: an integer in [1, MAX_WEIGHT]; anything unreadable is the default (a
    header is only a hint for the order of service, never trusted for more)."""
    try:
        weight = int(str(value))
    except (TypeError, ValueError):
        return DEFAULT_WEIGHT
    return min(max(weight, 1), MAX_WEIGHT)


def line_of(headers: Mapping[str, str] | None) -> tuple[str, int]:
    """The tenant line (``NO_TENANT`` when the message names none) and weight a message's headers give."""
    if not headers:
        return NO_TENANT, DEFAULT_WEIGHT
    return headers.get(TENANT_HEADER) or NO_TENANT, clamp_weight(headers.get(WEIGHT_HEADER, DEFAULT_WEIGHT))


class FairQueue(Generic[T]):
    """Items waiting per line (a tenant), served by weighted deficit round robin; FIFO within a line."""

    def __init__(self) -> None:
        self._lines: dict[str, deque[T]] = {}
        self._weight: dict[str, int] = {}
        self._deficit: dict[str, int] = {}
        self._turn: deque[str] = deque()   # the lines with items waiting, the one being served first
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[T]:
        """Every item waiting, in no particular order."""
        for line in self._lines.values():
            yield from line

    def put(self, line: str, item: T, weight: int = DEFAULT_WEIGHT) -> None:
        """Queue ``item`` at the end of ``line``; the line's weight is the latest its items gave. A line that
        had nothing waiting joins the round at its end."""
        queued = self._lines.get(line)
        if queued is None:
            queued = self._lines[line] = deque()
            self._deficit[line] = 0
            self._turn.append(line)
        queued.append(item)
        self._weight[line] = clamp_weight(weight)
        self._size += 1

    def take(self, n: int) -> list[T]:
        """Up to ``n`` items, by weighted deficit round robin, in the order served; the round goes on where the
        last ``take`` left it (a line cut short by ``n`` keeps its remaining credit and is served first next
        time)."""
        return [item for _, item in self._serve(n)]

    def take_batch(self, n: int) -> list[T]:
        """The items ``take`` would give, grouped by line in the lines' sorted order (FIFO within each): batches
        handled at once then lock each tenant's rows in one order, and never wait on each other in a circle."""
        return [item for _, item in sorted(self._serve(n), key=lambda served: served[0])]

    def _serve(self, n: int) -> list[tuple[str, T]]:
        out: list[tuple[str, T]] = []
        while len(out) < n and self._turn:
            line = self._turn[0]
            queued = self._lines[line]
            if self._deficit[line] < 1:
                self._deficit[line] += self._weight[line]
            served = min(self._deficit[line], n - len(out), len(queued))
            out.extend((line, queued.popleft()) for _ in range(served))
            self._deficit[line] -= served
            self._size -= served
            if not queued:
                self._forget(line)
            elif self._deficit[line] < 1:
                self._turn.rotate(-1)   # its turn is over: to the back of the round
        return out

    def drain(self) -> list[T]:
        """Every item waiting, removed (in no particular order)."""
        items = list(self)
        self._lines.clear()
        self._weight.clear()
        self._deficit.clear()
        self._turn.clear()
        self._size = 0
        return items

    def _forget(self, line: str) -> None:
        """An emptied line leaves the round with no credit kept: idling earns nothing."""
        self._turn.popleft()
        del self._lines[line], self._weight[line], self._deficit[line]


class TenantWeights:
    """The weights this process stamps on the messages it starts (the gateway fills it from its table; every
    other service inherits weights from the messages it handles and leaves it empty)."""

    def __init__(self) -> None:
        self._weights: dict[uuid.UUID, int] = {}

    def replace(self, weights: Mapping[uuid.UUID, int]) -> None:
        """Every tenant's weight at once (a tenant not named: the default)."""
        self._weights = {t: clamp_weight(w) for t, w in weights.items() if clamp_weight(w) != DEFAULT_WEIGHT}

    def set(self, tenant_id: uuid.UUID, weight: int) -> None:
        self._weights[tenant_id] = clamp_weight(weight)

    def get(self, tenant_id: uuid.UUID | None) -> int | None:
        """The tenant's weight when it is not the default (None: stamp nothing)."""
        if tenant_id is None:
            return None
        weight = self._weights.get(tenant_id, DEFAULT_WEIGHT)
        return weight if weight != DEFAULT_WEIGHT else None


# The process's weights, read by ``Outbox.envelope`` for a message with no cause to inherit from.
weights = TenantWeights()
