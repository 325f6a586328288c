"""The jobs of a Slurm node lost with its host: what ran there, until Slurm has requeued them, and letting them
start at once.

Setting the node DOWN makes slurmctld requeue the batch jobs that ran there (``JobRequeue=1``): each goes
COMPLETING, then PENDING with its begin time moved a couple of minutes ahead (reason ``BeginTime``), a pause
meant for a job that failed on its own. Tessera's jobs never ask for a begin time, so a pending job held for
``BeginTime`` was requeued by a node's loss and may start now (its pending reason may read ``BeginTime`` only after
the scheduler's next pass: the ids of the jobs that ran on the node say which).
"""
from __future__ import annotations

from .daemons import ClusterDaemons
from .jobs import expand_hostlist
from .rest import SlurmRest

STILL_THERE = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED"})
ENDED_BY_LOSS = frozenset({"FAILED", "NODE_FAIL"})   # what a job whose step lost a node may end as


async def running_on(rest: SlurmRest, node: str) -> set[int]:
    """Ids of the jobs on ``node`` now (running, or still completing there)."""
    return {raw["job_id"] for raw in await rest.jobs()
            if raw.get("job_state") in STILL_THERE and node in expand_hostlist(raw.get("nodes", ""))}


async def requeued(rest: SlurmRest, ids: set[int]) -> bool:
    """Every one of ``ids`` has left its run (pending again, or ended: a job that does not allow requeue)."""
    if not ids:
        return True
    return not any(raw["job_id"] in ids and raw.get("job_state") in STILL_THERE for raw in await rest.jobs())


# what a job Tessera requeued may be held for: its requeue crossed slurmctld's own after the loss (seen with a
# moved controller); no tenant can have held it, a running or ended job cannot be held
HELD = frozenset({"JobHeldUser", "JobHeldAdmin", "launch_failed_requeued_held"})


async def release(daemons: ClusterDaemons, netns: str | None, rest: SlurmRest, ids: set[int]) -> list[int]:
    """Let the requeued jobs start now: those of ``ids`` pending again (released first when held: ``HELD``),
    and any held back for ``BeginTime`` (after a controller restart the requeue may predate what it remembers).
    Their ids."""
    pending_now = [raw for raw in await rest.jobs() if raw.get("job_state") == "PENDING"
                   and (raw["job_id"] in ids or raw.get("state_reason") == "BeginTime")]
    for raw in pending_now:
        if raw["job_id"] in ids and raw.get("state_reason") in HELD:
            await daemons.scontrol(netns, "release", str(raw["job_id"]))
        await daemons.scontrol(netns, "update", f"JobId={raw['job_id']}", "StartTime=now")
    return [raw["job_id"] for raw in pending_now]


async def again(daemons: ClusterDaemons, netns: str | None, rest: SlurmRest, ids: list[str]) -> list[str]:
    """Requeue those of ``ids`` that ended by the loss (``scontrol requeue`` takes a finished batch job back); the
    ids requeued. Pending, running or otherwise ended jobs are left alone."""
    ended = {str(raw["job_id"]) for raw in await rest.jobs() if raw.get("job_state") in ENDED_BY_LOSS}
    out = [i for i in ids if i in ended]
    for job_id in out:
        await daemons.scontrol(netns, "requeue", job_id)
    return out


async def pending(rest: SlurmRest, ids: set[int]) -> bool:
    """Every one of ``ids`` is pending again (a requeue passes through other states first)."""
    return all(raw.get("job_state") == "PENDING" for raw in await rest.jobs() if raw["job_id"] in ids)
