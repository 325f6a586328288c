"""The pending queue: priority classes, FIFO within a tenant, weighted fair share across tenants,
bounded per tenant (pure, no I/O).

Fairness: **weighted fair share on GPUs**. Dominant resource fairness exists for jobs whose
demands mix resources in different proportions; here every slot bundles one GPU with its NVMe,
its IB VF and a fixed share of CPU and memory, so every resource a request takes is proportional
to its GPU count and the dominant share IS the GPU share. Weighted fair share on GPUs gives the
same order with one number per tenant, and weights let a provider favour contracted tenants.

Order: strict priority classes (higher first). Within a class, the tenant with the lowest
``(GPUs in use + GPUs already offered in this pass) / weight`` goes next (ties: the older head
request, then tenant id), offering its requests in FIFO order. A tenant flooding the queue thus
gets its next turn only after every tenant using less has had one: another tenant's wait is
bounded by its position in share order, never by the flood's length. ``max_per_tenant`` bounds
the memory and the work one tenant's backlog can cost (``push`` raises QueueFull beyond it).
"""
from __future__ import annotations

import heapq
import uuid
from collections.abc import Iterable, Iterator, Mapping

from .inventory import Request


def demand_kind(req: Request) -> tuple:
    """What decides where a request can go, quota aside: requests of one kind fit the same slots."""
    return (req.shape, req.pool, req.tolerations)


class QueueFull(Exception):
    """The tenant already has ``limit`` pending requests."""

    def __init__(self, tenant: uuid.UUID, limit: int) -> None:
        super().__init__(f"tenant {tenant} already has {limit} pending request(s), the most allowed")
        self.tenant, self.limit = tenant, limit


class FairQueue:
    """Pending requests. Not thread-safe; ``order`` snapshots lazily, so the caller may cancel or
    push while iterating (a request cancelled before its turn is skipped)."""

    def __init__(self, max_per_tenant: int = 100, weights: Mapping[uuid.UUID, float] | None = None) -> None:
        if max_per_tenant < 1:
            raise ValueError(f"max_per_tenant must be at least 1, not {max_per_tenant}")
        self.max_per_tenant = max_per_tenant
        self._weights: dict[uuid.UUID, float] = dict(weights or {})
        self._classes: dict[int, dict[uuid.UUID, dict[uuid.UUID, Request]]] = {}
        self._where: dict[uuid.UUID, Request] = {}
        self._count: dict[uuid.UUID, int] = {}
        self._kinds: dict[tuple, dict[uuid.UUID, Request]] = {}   # demand kind -> its pending requests

    def set_weight(self, tenant: uuid.UUID, weight: float) -> None:
        if not weight > 0:
            raise ValueError(f"tenant {tenant}: weight must be positive, not {weight!r}")
        self._weights[tenant] = weight

    def push(self, req: Request) -> None:
        """Append ``req`` to its tenant's FIFO in its priority class. Pushing a request already
        pending is a no-op. Raises QueueFull (nothing changes) when the tenant is at the bound."""
        if req.allocation_id in self._where:
            return
        n = self._count.get(req.tenant_id, 0)
        if n >= self.max_per_tenant:
            raise QueueFull(req.tenant_id, self.max_per_tenant)
        self._classes.setdefault(req.priority, {}).setdefault(req.tenant_id, {})[req.allocation_id] = req
        self._where[req.allocation_id] = req
        self._count[req.tenant_id] = n + 1
        self._kinds.setdefault(demand_kind(req), {})[req.allocation_id] = req

    def cancel(self, allocation_id: uuid.UUID) -> Request | None:
        """Remove a pending request; returns it, or None if it was not pending. Idempotent."""
        req = self._where.pop(allocation_id, None)
        if req is None:
            return None
        tenants = self._classes[req.priority]
        fifo = tenants[req.tenant_id]
        del fifo[allocation_id]
        if not fifo:
            del tenants[req.tenant_id]
            if not tenants:
                del self._classes[req.priority]
        same = self._kinds[demand_kind(req)]
        del same[allocation_id]
        if not same:
            del self._kinds[demand_kind(req)]
        left = self._count[req.tenant_id] - 1
        if left:
            self._count[req.tenant_id] = left
        else:
            del self._count[req.tenant_id]
        return req

    def get(self, allocation_id: uuid.UUID) -> Request | None:
        return self._where.get(allocation_id)

    def __contains__(self, allocation_id: object) -> bool:
        return allocation_id in self._where

    def __len__(self) -> int:
        return len(self._where)

    def kinds(self) -> dict[tuple, Request]:
        """Each demand kind (see ``demand_kind``) pending now, with one of its requests."""
        return {k: next(iter(reqs.values())) for k, reqs in self._kinds.items()}

    def pending_of(self, tenant: uuid.UUID) -> int:
        return self._count.get(tenant, 0)

    def pending(self) -> dict[uuid.UUID, int]:
        """Tenant -> number of pending requests."""
        return dict(self._count)

    def pending_gpus(self, copies: Mapping[uuid.UUID, int] | None = None) -> dict[str | None, int]:
        """Pool (None: any pool) -> the GPUs pending non-spot requests wait for; ``copies`` counts an entry that
        stands for several requests (a gang's) that many times."""
        out: dict[str | None, int] = {}
        for aid, req in self._where.items():
            if not req.spot:
                n = req.shape.gpu_count * (copies or {}).get(aid, 1)
                out[req.pool] = out.get(req.pool, 0) + n
        return out

    def order(self, usage: Mapping[uuid.UUID, int]) -> Iterator[Request]:
        """The order in which to try pending requests now (see module docstring). ``usage`` maps a
        tenant to the GPUs it holds. Lazy: stop iterating whenever enough has been tried."""
        for prio in sorted(self._classes, reverse=True):
            tenants = self._classes.get(prio)
            if not tenants:
                continue
            heap = []
            for t, fifo in tenants.items():
                head = next(iter(fifo.values()))
                heap.append((usage.get(t, 0) / self._weights.get(t, 1.0), head.enqueued_at, t.int, t, None))
            heapq.heapify(heap)
            yield from self._drain(heap, tenants)

    def ranked(self, usage: Mapping[uuid.UUID, int], kinds: Iterable[tuple] = (),
               tenant: uuid.UUID | None = None, limit: int | None = None) -> list[Request]:
        """The pending requests of ``kinds`` and of ``tenant`` in ``order``'s order, except that
        shares are not advanced within the list (for a pass that can place only a few: one node
        was freed). At most ``limit`` of them."""
        reqs: dict[uuid.UUID, Request] = {}
        for k in kinds:
            reqs.update(self._kinds.get(k, {}))
        if tenant is not None:
            for tenants in self._classes.values():
                reqs.update(tenants.get(tenant, {}))

        def key(r: Request) -> tuple:
            return (-r.priority, usage.get(r.tenant_id, 0) / self._weights.get(r.tenant_id, 1.0),
                    r.enqueued_at, r.tenant_id.int)
        if limit is not None and limit < len(reqs):
            return heapq.nsmallest(limit, reqs.values(), key=key)
        return sorted(reqs.values(), key=key)

    def _drain(self, heap: list, tenants: dict) -> Iterator[Request]:
        while heap:
            share, _, tie, t, snap = heapq.heappop(heap)
            if snap is None:
                fifo = tenants.get(t)
                snap = iter(list(fifo.values()) if fifo else ())
            req = next(snap, None)
            while req is not None and req.allocation_id not in self._where:
                req = next(snap, None)      # cancelled or placed meanwhile
            if req is None:
                continue
            yield req
            share += req.shape.quota_units / self._weights.get(t, 1.0)
            heapq.heappush(heap, (share, req.enqueued_at, tie, t, snap))
