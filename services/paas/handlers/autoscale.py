"""The autoscaling loop of the clusters that carry a policy (one replica at a time: the leader's windows).

Every ``sample_s`` each such cluster gets a sample: per node, its GPU utilisation and its running jobs. The
utilisation comes from the node-agents' GPU metrics (the heartbeats' DCGM-named samples, by the allocation whose
slot holds the GPU) with ``source="metrics"``; with ``source="scheduler"`` (simulated GPUs: their metrics are a
random walk that says nothing of the work) it is the share of the node's GPUs the cluster's own scheduler has
given to jobs. Every ``tick_s`` the pure ``domain.autoscale.decide`` answers, on a sample taken at the tick
(the surge rule's evidence is the last two samples: with the sampling loop's alone the newest could be a whole
period old, which would put a step's decision up to 25 s after it, not 20 s); a scale-out is a new gang (the same
path as a tenant's scale), a scale-in marks the named nodes draining (the reconciler drains them in the cluster's
scheduler, waits for *drained*, then releases them). Each change shows on the cluster (``reason`` names the
autoscaler's why) through ``paas.cluster_changed``.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

import structlog

from services.node_agent.contracts.health import Heartbeat
from shared.envelope import Envelope

from ..adapters.repository import PgClusters
from ..domain.autoscale import ClusterState, Hold, NodeSample, Sample, ScaleIn, ScaleOut, ScalingPolicy, Window, decide
from ..domain.clusters import Cluster
from . import clusters as cluster_handlers
from .reconcile import Runtimes
from .specs import handle_of

log = structlog.get_logger()
_METRIC_TTL_S = 30.0     # a GPU sample older than this is not the node's utilisation now


class Autoscaler:
    def __init__(self, begin, runtimes: Runtimes, *, source: str, tick_s: float, window_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.begin, self.runtimes, self.source = begin, runtimes, source
        self.tick_s, self.window_s, self.clock = tick_s, window_s, clock
        self.windows: dict[uuid.UUID, Window] = {}
        self.last_change: dict[uuid.UUID, float] = {}
        self.gpu_util: dict[uuid.UUID, dict[int, tuple[float, float]]] = {}   # allocation -> gpu -> (at, 0..1)
        self._pruned_at = clock()
        self._sampling = asyncio.Lock()   # the sampling loop and the tick both sample: one at a time, in order

    async def on_heartbeat(self, msg) -> None:
        """A node-agent's heartbeat (a core NATS message, every replica's listener): its GPUs' utilisation by
        allocation. One that does not parse is logged and dropped."""
        try:
            hb = Heartbeat.model_validate(Envelope.model_validate_json(msg.data).data)
        except ValueError as exc:
            log.warning("paas.heartbeat_unreadable", subject=getattr(msg, "subject", None), error=str(exc)[:300])
            return
        now = self.clock()
        for g in hb.gpus:
            if g.allocation_id is not None:
                self.gpu_util.setdefault(g.allocation_id, {})[g.gpu] = (now, max(0.0, min(1.0, g.util_pct / 100)))
        if now - self._pruned_at >= _METRIC_TTL_S:
            self._prune(now)

    def _prune(self, now: float) -> None:
        """Forget the GPUs no heartbeat has told of for longer than a sample stays fresh, and the allocations left
        with none: every allocation of the fleet passes through here, and one released is never told of again
        (every replica listens, so each prunes its own, once a TTL)."""
        self._pruned_at = now
        for allocation_id in list(self.gpu_util):
            gpus = {gpu: seen for gpu, seen in self.gpu_util[allocation_id].items() if now - seen[0] <= _METRIC_TTL_S}
            if gpus:
                self.gpu_util[allocation_id] = gpus
            else:
                del self.gpu_util[allocation_id]

    async def _clusters(self) -> list[Cluster]:
        async with self.begin() as uow:
            repo = PgClusters(uow.conn)
            return [c for cid in await repo.autoscaled() if (c := await repo.get(cid)) is not None]

    async def sample_step(self) -> None:
        """Add a sample of every autoscaled cluster to its window (samples go in in time order: a window
        refuses an older one)."""
        async with self._sampling:
            await self._sample()

    async def _sample(self) -> None:
        now = self.clock()
        live = set()
        for cl in await self._clusters():
            live.add(cl.id)
            ready = [m for m in cl.live_members if m.state == "ready"]
            if not cl.handle or not ready:
                continue
            uses = {n.name: n for n in await self.runtimes[cl.kind].nodes(handle_of(cl))}
            nodes = []
            for m in ready:
                use = uses.get(cl.node_name(m))
                running = use.running_jobs if use else 0
                nodes.append(NodeSample(cl.node_name(m), self._util(m.allocation_id, use, cl.gpu_count, now),
                                        running, cl.gpu_count))
            window = self.windows.setdefault(cl.id, Window(self.window_s, max(self.tick_s, 3 * self.sample_s),
                                                           min(self.sample_s, self.window_s)))
            window.add(Sample(now, tuple(nodes)))
        for gone in set(self.windows) - live:
            self.windows.pop(gone, None)
            self.last_change.pop(gone, None)

    @property
    def sample_s(self) -> float:
        """How often it samples: six times a tick, so that a sample 2 s late (a heartbeat's) still shows a step
        in time for the surge rule's decision within 20 s."""
        return self.tick_s / 6

    def _util(self, allocation_id: uuid.UUID, use, gpus: int, now: float) -> float:
        if self.source == "scheduler":
            return min(1.0, (use.gpus_in_use if use else 0) / max(1, gpus))
        fresh = [u for at, u in self.gpu_util.get(allocation_id, {}).values() if now - at <= _METRIC_TTL_S]
        return sum(fresh) / len(fresh) if fresh else 0.0

    async def decide_step(self) -> None:
        try:
            await self.sample_step()
        except Exception as exc:    # a scheduler that does not answer now: decide on the sampling loop's samples
            log.warning("paas.autoscale_tick_sample_failed", error=repr(exc))
        now = self.clock()
        for cl in await self._clusters():
            if cl.state != "ready" or not cl.handle or cl.id not in self.windows:
                continue
            policy = ScalingPolicy(cl.autoscaling["min_nodes"], cl.autoscaling["max_nodes"],
                                   cl.autoscaling["target_gpu_util"], cl.autoscaling["cooldown_s"])
            live = sorted(cl.live_members, key=lambda m: m.idx)
            state = ClusterState(
                nodes=tuple(cl.node_name(m) for m in live),
                pending_jobs=await self.runtimes[cl.kind].pending(handle_of(cl)),
                joining=frozenset(cl.node_name(m) for m in live if m.state in ("placing", "provisioning", "active")),
                draining=frozenset(cl.node_name(m) for m in live if m.state == "draining"),
                last_change_at=self.last_change.get(cl.id))
            decision = decide(policy, self.windows[cl.id], state, now)
            if isinstance(decision, Hold):
                continue
            await self._apply(cl.id, decision)
            self.last_change[cl.id] = now
            log.info("paas.autoscaled", cluster_id=str(cl.id), decision=type(decision).__name__,
                     reason=decision.reason)

    async def _apply(self, cluster_id: uuid.UUID, decision: ScaleOut | ScaleIn) -> None:
        async with self.begin() as uow:
            cl = await PgClusters(uow.conn).get(cluster_id, lock=True)
            if cl is None or cl.state != "ready":
                return
            reason = f"autoscaler: {decision.reason}"
            if isinstance(decision, ScaleOut):
                return await cluster_handlers.scale(uow, cl, len(cl.live_members) + decision.count, "autoscaler",
                                                    reason=reason)
            names = set(decision.nodes)
            for m in cl.live_members:
                if cl.node_name(m) in names and m.idx != 0:
                    m.state = "draining"
            cl.state, cl.reason = "scaling", reason
            cl.node_count = len([m for m in cl.live_members if m.state != "draining"])
            await cluster_handlers.publish(uow, cl)
