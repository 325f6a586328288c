"""The PaaS service's subscriptions: wire message → handler, nothing else (what it does on its own: loops.py)."""
from __future__ import annotations

from functools import partial

from shared.runtime import Runtime

from ..domain.jobs import JobPolicy
from ..handlers import clusters, jobs, node_loss, nodes, spot
from ..handlers.reconcile import Runtimes


def wire(rt: Runtime, runtimes: Runtimes, policy: JobPolicy) -> None:
    sub = rt.consumers.subscribe
    for name in ("create_cluster", "scale_cluster", "delete_cluster"):
        sub(f"paas.{name}", getattr(clusters, name), on_refused=clusters.refused)
    sub("paas.submit_job", partial(jobs.submit_job, policy=policy), on_refused=jobs.refused)
    sub("paas.cancel_job", jobs.cancel_job, on_refused=jobs.refused)
    sub("scheduler.gang_placed", nodes.gang_placed)
    sub("scheduler.gang_queued", nodes.gang_queued)
    sub("scheduler.gang_rejected", nodes.gang_rejected)
    # every allocation's events, of which only those of the clusters' and the spot offerings' nodes are handled
    ours = partial(sub, interest=nodes.follows)
    ours("network.network_attached", nodes.network_attached)
    ours("allocation.activated", nodes.activated)
    ours("allocation.failed", nodes.failed)
    ours("allocation.released", nodes.released)
    ours("allocation.interrupted", node_loss.interrupted)
    ours("allocation.rescheduled", node_loss.rescheduled)
    sub("paas.set_spot_offering", spot.set_spot_offering, on_refused=spot.refused)
    sub("scheduler.scheduling_stats", spot.on_stats)
    sub("scheduler.preemption_notice", spot.on_preemption_notice)
    rt.answer("paas.job_logs", lambda q: jobs.job_logs(q, pool=rt.pool, runtimes=runtimes))
