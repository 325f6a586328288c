"""The spot market told what the offerings hold (leader only; the driver's calls run out of any transaction), and
reclaimed nodes released when their notice ends.

Each pass reads every offering, registers the market cluster of an offering that is enabled or still holds nodes
(again after a restart: the driver keeps nothing, so every node it should know is offered again), offers the nodes
just placed, reclaims those being taken back with what is left of their notice (cordon, then drain after the
grace), reclaims at once a node that ended without notice (a failure), and deregisters an offering disabled and
empty. It then records what the market was told, and releases the nodes whose notice has ended. Every
``usage_s`` it asks the market what its workloads use of the offered nodes (``report_usage``), shown on the offering.
"""
from __future__ import annotations

import time
from collections.abc import Callable

import structlog

from services.allocation.contracts import ReleaseAllocation

from ..adapters.spot_store import SpotStore
from ..domain import offering as dom
from ..domain.offering import Offering, SpotNode
from ..domain.spot import SpotCapacityProvider
from .spot import node_name, publish

log = structlog.get_logger()
COMPUTE_PLATFORM = "TESSERA"
OFFER_TTL_S = 3600.0          # an offer's ``until``; renewed by the next registration


class SpotMarket:
    def __init__(self, begin, provider_of: Callable[[str], SpotCapacityProvider], *, read,
                 usage_s: float = 15.0) -> None:
        """``begin``: a unit of work; ``read``: a connection for the offerings' lone read each pass."""
        self.begin, self.read = begin, read
        self.provider_of = provider_of
        self.usage_s = usage_s
        self._providers: dict[str, SpotCapacityProvider] = {}
        self._registered: dict[str, str] = {}        # pool -> the market cluster it is registered as
        self._asked: dict[str, float] = {}           # pool -> when the market last reported its usage

    async def step(self) -> None:
        async with self.read() as conn:
            offerings = await SpotStore(conn).all()
        for off in offerings:
            try:
                told = await self._tell(off, time.time())
                usage = await self._usage(off, time.monotonic())
            except Exception:   # one market call failing must not stop the others; retried next pass
                log.exception("paas.spot_market_failed", pool=off.pool)
                continue
            if told or dom.due_releases(off, time.time()) or usage is not None:
                await self._record(off.pool, told, usage)

    async def _usage(self, off: Offering, now: float) -> dict | None:
        """What the market's workloads use of the offered nodes (every ``usage_s``); None when not asked now or
        unchanged."""
        if off.pool not in self._registered or now - self._asked.get(off.pool, -self.usage_s) < self.usage_s:
            return None
        self._asked[off.pool] = now
        usage = await self._provider(off.pool).report_usage()
        return usage if usage != off.market_usage else None

    def _provider(self, pool: str) -> SpotCapacityProvider:
        if pool not in self._providers:
            self._providers[pool] = self.provider_of(pool)
        return self._providers[pool]

    async def _tell(self, off: Offering, now: float) -> dict:
        """The market calls the offering needs now; returns {allocation id: state told}."""
        market = self._provider(off.pool)
        pending = dom.untold(off)
        if off.enabled or off.live:
            if self._registered.get(off.pool) != off.cluster_name:
                await market.register_cluster(off.cluster_name, off.group, off.region, COMPUTE_PLATFORM, (), ())
                self._registered[off.pool] = off.cluster_name
                pending = [n for n in off.nodes if n.state in ("offered", "reclaiming")] + \
                    [n for n in pending if not n.live]
        elif off.pool in self._registered:
            await market.deregister()
            del self._registered[off.pool]
            return {}
        if off.pool not in self._registered:
            return {}
        offered = [n for n in pending if n.state == "offered"]
        if offered:
            await market.offer_nodes(self._names(off, offered), off.gpu_model, off.gpu_count, now + OFFER_TTL_S)
        for n in (n for n in pending if n.state == "reclaiming"):
            await market.reclaim_nodes(self._names(off, [n]), max(0.0, (n.reclaim_by or now) - now), "cordon_and_drain")
        gone = [n for n in pending if not n.live and n.told == "offered"]
        if gone:    # ended without notice (its node failed): nothing of it can run any more
            await market.reclaim_nodes(self._names(off, gone), 0.0, "cordon_and_drain")
        return {n.allocation_id: n.state for n in pending}

    @staticmethod
    def _names(off: Offering, nodes: list[SpotNode]) -> tuple[str, ...]:
        return tuple(node_name(n, off.pool) for n in nodes)

    async def _record(self, pool: str, told: dict, usage: dict | None = None) -> None:
        now = time.time()
        async with self.begin() as uow:
            store = SpotStore(uow.conn)
            off = await store.get(pool, lock=True)
            if off is None:
                return
            changed = False
            for n in off.nodes:
                if told.get(n.allocation_id) == n.state and n.told != n.state:
                    n.told, changed = n.state, True
            due = dom.due_releases(off, now)
            for n in due:
                n.release_sent = True
            if usage is not None:
                off.market_usage = usage
            if due or usage is not None:
                await uow.emit_many([("allocation.release", ReleaseAllocation(
                    allocation_id=n.allocation_id, tenant_id=off.tenant_id, requested_by=off.user_id), None)
                    for n in due], correlation_id=f"spot:{pool}", tenant_id=off.tenant_id)
                await publish(uow, off, now)
            elif changed:
                await store.save(off)
