"""What the PaaS service does on its own: the reconciler's steps, one replica at a time."""
from __future__ import annotations

from shared.runtime import Runtime
from shared.unit_of_work import UnitOfWork

from ..handlers.autoscale import Autoscaler
from ..handlers.reconcile import Reconciler, Runtimes
from ..handlers.spot_market import SpotMarket
from ..settings import PaasSettings


def wire(rt: Runtime, runtimes: Runtimes, paas: PaasSettings, spot_provider_of) -> None:
    def begin():
        return UnitOfWork.begin(rt.pool, rt.outbox, name="paas.reconcile")

    def read():
        return rt.pool.acquire()
    reconciler = Reconciler(begin, runtimes, netns=paas.nodes == "netns", read=read)
    rt.every(paas.reconcile_s, reconciler.clusters_step, leader="paas", at_once=True)
    rt.every(paas.reconcile_s, reconciler.jobs_step, leader="paas", at_once=True)
    market = SpotMarket(begin, spot_provider_of, read=read, usage_s=paas.spot_usage_s)
    rt.every(paas.reconcile_s, market.step, leader="paas", at_once=True)
    scaler = Autoscaler(begin, runtimes, source=paas.utilisation, tick_s=paas.autoscale_tick_s,
                        window_s=paas.autoscale_window_s)
    if paas.utilisation != "scheduler":   # metrics: the GPUs' utilisation comes in the heartbeats
        rt.listen("node_agent.heartbeat", scaler.on_heartbeat)
    rt.every(scaler.sample_s, scaler.sample_step, leader="paas", at_once=True)
    rt.every(paas.autoscale_tick_s, scaler.decide_step, leader="paas")
