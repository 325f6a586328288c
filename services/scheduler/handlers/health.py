"""The health monitor: heartbeats in, node health out; cordon, drain and fence by the provider's policy.

Every replica listens to every node-agent's heartbeat (a core-NATS subscription, nothing stored: a heartbeat
proves the agent is alive *now*) and keeps the last one per node in memory. The leader judges every watched
node once a period (``judge``, pure rules in ``domain.health``): liveness from the time since the last
heartbeat (never less than the time since this replica began to lead, so a takeover gives every node one full
timeout), alerts classified by the policy, and what the scheduler does about new alerts:

- a cordoning classification cordons the node (the pool's breaker permitting) and records which condition did;
- ``drain`` sends ``allocation.interrupt`` for every allocation placed on the node (the saga coordinator
  reschedules each elsewhere);
- a node that answers and still holds instances of allocations placed elsewhere is sent
  ``node_agent.fence_instances`` for them (again every ``fence_retry_s`` until they are gone);
- a cordon that a lost heartbeat made is lifted once the node is healthy again; any other stays until a
  provider admin uncordons.
Every change is kept in the node's history and published whole as ``scheduler.node_health_changed``.
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime

import structlog

from services.allocation.contracts import InterruptAllocation
from services.node_agent.contracts import FenceInstances
from shared.envelope import Envelope, utcnow
from shared.unit_of_work import UnitOfWork

from .. import contracts as c
from ..adapters import health as store
from ..adapters.metrics import BREAKER_OPEN, DETECTION_TO_CORDON, INTERRUPTION_INTERVAL, NODE_STATE
from ..domain import health as rules
from ..settings import SchedulerSettings
from .active import ActiveScheduler
from .common import Rejected, admin, emit_node, known_node
from .placing import place_waiting

log = structlog.get_logger()

NEXT = "Tessera moves it to a healthy node: the same allocation, network address and named volumes."


@dataclass
class HealthMonitor:
    """The last heartbeat of each node as this replica received it, and when it last sent each node a fence."""

    settings: SchedulerSettings
    beats: dict[uuid.UUID, tuple[datetime, dict]] = field(default_factory=dict)
    fenced_at: dict[uuid.UUID, float] = field(default_factory=dict)
    drained_at: dict[uuid.UUID, datetime] = field(default_factory=dict)   # the last drain of each node
    leading_since: datetime | None = None

    async def keep(self, msg) -> None:
        """Keep the heartbeat (an envelope, or the bare payload); one that does not parse is logged and dropped."""
        try:
            body = Envelope.model_validate_json(msg.data).data
        except ValueError:
            try:
                body = json.loads(msg.data)
            except ValueError:
                log.warning("scheduler.heartbeat_unreadable", subject=msg.subject)
                return
        try:
            node_id = uuid.UUID(str(body["node_id"]))
        except (KeyError, ValueError):
            log.warning("scheduler.heartbeat_unreadable", subject=msg.subject)
            return
        if not msg.subject.endswith(str(node_id)):   # an agent speaks for its own node only
            log.warning("scheduler.heartbeat_for_another_node", subject=msg.subject, node_id=str(node_id))
            return
        self.beats[node_id] = (utcnow(), body)

    def may_fence(self, node_id: uuid.UUID) -> bool:
        now = time.monotonic()
        if now - self.fenced_at.get(node_id, -1e9) < self.settings.fence_retry_s:
            return False
        self.fenced_at[node_id] = now
        return True


async def on_heartbeat(msg, *, monitor: HealthMonitor) -> None:
    """A node-agent's heartbeat (every replica's listener): kept in memory for the leader's judgement."""
    await monitor.keep(msg)


def _alerts(beat: dict, policy: dict[str, tuple[str, ...]]) -> list[rules.Alert]:
    out = []
    for a in beat.get("alerts") or ():
        since = a["since"] if isinstance(a["since"], datetime) else datetime.fromisoformat(a["since"])
        out.append(rules.Alert(a["source"], a["target"], a["condition"], since, a.get("message", ""),
                               a.get("tenant_message", ""), rules.classify(a["condition"], policy)))
    return out


def _as_doc(alert: rules.Alert) -> dict:
    return {"source": alert.source, "target": alert.target, "condition": alert.condition,
            "since": alert.since.isoformat(), "message": alert.message, "tenant_message": alert.tenant_message,
            "classifications": list(alert.classifications)}


def _key(alert: rules.Alert) -> list[str]:
    return [alert.target, alert.condition, alert.since.isoformat()]


async def publish(uow: UnitOfWork, row: dict, event: str, breaker_open: bool = False) -> None:
    await uow.emit("scheduler.node_health_changed", c.NodeHealthChanged(
        node_id=row["node_id"], pool=row["pool"], state=row["state"], since=row["since"], last_seen=row["last_seen"],
        alerts=row["alerts"], cordoned_by=row["cordoned_by"], draining=row["draining"],
        drain_deadline=row["drain_deadline"], breaker_open=breaker_open, event=event[:200], version=row["version"]),
        correlation_id=str(row["node_id"]))


async def interrupt_all(uow: UnitOfWork, node_id: uuid.UUID, category: str, reason: str, at: datetime) -> int:
    """Send ``allocation.interrupt`` for every allocation placed on the node; returns how many."""
    placed = await store.placements(uow.conn, node_id)
    await uow.emit_many([("allocation.interrupt", InterruptAllocation(
        allocation_id=p["allocation_id"], tenant_id=p["tenant_id"], node_id=node_id, category=category,
        reason=reason[:2000], interrupted_at=at, next=NEXT), None) for p in placed], correlation_id=str(node_id))
    return len(placed)


async def set_cordon(uow: UnitOfWork, active: ActiveScheduler, node_id: uuid.UUID, cordoned: bool) -> None:
    repo = active.repository(uow.conn)
    await repo.update_node(node_id, {"cordoned": cordoned})
    active.apply_node(await repo.node(node_id))
    await emit_node(uow, repo, node_id, correlation_id=str(node_id))
    if not cordoned:
        await place_waiting(uow, active)


async def _may_cordon(uow: UnitOfWork, pool: str, now: datetime, settings: SchedulerSettings) -> tuple[bool, bool]:
    """(the pool's breaker lets one more automatic cordon happen now, the breaker is open), recording the cordon."""
    row = await store.breaker(uow.conn, pool)
    breaker = rules.Breaker(pool, settings.breaker_share, settings.breaker_window_s, list(row["cordons"]),
                            row["open"], row["opened_at"])
    allowed = breaker.allows(now, await store.pool_size(uow.conn, pool))
    if allowed:
        breaker.record(now)
    saved = await store.save_breaker(uow.conn, pool, breaker.open, breaker.opened_at, breaker.cordons)
    BREAKER_OPEN.labels(pool).set(1 if breaker.open else 0)
    if breaker.open and not row["open"]:
        log.warning("scheduler.health_breaker_opened", pool=pool)
        await emit_breaker(uow, saved, settings, now)
    return allowed, breaker.open


async def emit_breaker(uow: UnitOfWork, row: dict, settings: SchedulerSettings, now: datetime) -> None:
    breaker = rules.Breaker(row["pool"], settings.breaker_share, settings.breaker_window_s, list(row["cordons"]))
    await uow.emit("scheduler.breaker_changed", c.BreakerChanged(
        pool=row["pool"], open=row["open"], opened_at=row["opened_at"], cordons_in_window=len(breaker.recent(now)),
        share=settings.breaker_share, window_s=settings.breaker_window_s, version=row["version"]),
        correlation_id=f"breaker:{row['pool']}")


@dataclass(frozen=True)
class Assessment:
    """What the node's row and its last heartbeat say at ``now``, before any database truth is read."""

    heard: bool                        # a heartbeat ever came (a node never heard from is never judged)
    last_seen: datetime | None
    live: str                          # liveness: healthy, suspect, unreachable (unknown: never heard)
    fresh: dict | None                 # the last heartbeat while it is recent, else None
    alerts: list[rules.Alert]


def assess(monitor: HealthMonitor, row: dict, policy: dict[str, tuple[str, ...]], now: datetime) -> Assessment:
    """Pure: liveness since the last heartbeat (never less than since this replica began to lead), and the
    current alerts classified: the heartbeat's while it is fresh, else what the node last reported, plus
    ``heartbeat_lost`` once it is unreachable."""
    beat = monitor.beats.get(row["node_id"])
    heard = row["last_seen"] is not None or beat is not None
    seen = [t for t in (row["last_seen"], beat[0] if beat else None, monitor.leading_since) if t is not None]
    last_seen = max(seen) if heard else None
    timeout = monitor.settings.heartbeat_timeout_s
    live = rules.liveness(last_seen, now, timeout) if heard else rules.UNKNOWN
    fresh = beat[1] if beat is not None and (now - beat[0]).total_seconds() < timeout else None
    if fresh is not None:
        alerts = _alerts(fresh, policy)
    else:   # what the node last reported stands while it is silent
        alerts = [a for a in _alerts({"alerts": row["alerts"]}, policy) if a.condition != rules.HEARTBEAT_LOST]
    if live == rules.UNREACHABLE:
        lost = rules.lost_heartbeat(last_seen)
        alerts.append(replace(lost, classifications=rules.classify(lost.condition, policy)))
    return Assessment(heard, last_seen, live, fresh, alerts)


def _instances(beat: dict | None) -> list[uuid.UUID]:
    return [uuid.UUID(str(i)) for i in (beat or {}).get("instances") or ()]


def worth_judging(a: Assessment, row: dict, active: ActiveScheduler, now: datetime) -> bool:
    """Whether judging the node could change anything: its state or alerts differ from its row, it may hold an
    allocation placed elsewhere (by the index; the judgement asks the database), it is still reconciling, a
    cordon a lost heartbeat made may be lifted, or its drain deadline passed. Most nodes, most periods: no, and
    no transaction is opened for them."""
    if not a.heard:
        return row["draining"] and row["drain_deadline"] is not None and now >= row["drain_deadline"]
    sched = active.sched
    stray = sched is not None and any(
        (held := sched.inv.holding(i)) is None or held[1].node_id != row["node_id"] for i in _instances(a.fresh))
    changed = rules.next_state(row["state"], a.live, stray) != row["state"]
    alerts_changed = [_key(x) for x in a.alerts] != [_key(x) for x in _alerts({"alerts": row["alerts"]}, {})]
    return (changed or alerts_changed or stray or row["state"] == rules.RECONCILING
            or (row["cordoned"] and row["cordoned_by"] == rules.HEARTBEAT_LOST and a.live == rules.HEALTHY)
            or (row["draining"] and row["drain_deadline"] is not None and now >= row["drain_deadline"]))


async def judge(uow: UnitOfWork, active: ActiveScheduler, monitor: HealthMonitor, row: dict,
                policy: dict[str, tuple[str, ...]], now: datetime) -> None:
    """One node's health at ``now``: state, alerts, and what to do about the new ones (see the module)."""
    settings, node_id = monitor.settings, row["node_id"]
    a = assess(monitor, row, policy, now)
    last_seen, live, alerts = a.last_seen, a.live, a.alerts
    stray: set[uuid.UUID] = set()
    if held := _instances(a.fresh):
        stray = set(held) - await store.placed_on(uow.conn, node_id, held)
    state = rules.next_state(row["state"], live, bool(stray)) if a.heard else rules.UNKNOWN

    acted = {tuple(k) for k in row["acted"]}
    new = [a for a in alerts if tuple(_key(a)) not in acted]
    todo = rules.actions(new)
    events: list[str] = []
    cordoned, cordoned_by, breaker_open = row["cordoned"], row["cordoned_by"], False
    if todo & rules.CORDONING:
        cause = next(a for a in new if set(a.classifications) & rules.CORDONING)
        allowed, breaker_open = (True, False) if cordoned else await _may_cordon(uow, row["pool"], now, settings)
        if not allowed:
            events.append(f"{cause.condition} on {cause.target}: not cordoned, the pool's breaker is open")
            todo = frozenset()
        elif not cordoned:
            await set_cordon(uow, active, node_id, True)
            cordoned, cordoned_by = True, cause.condition
            began = last_seen if cause.condition == rules.HEARTBEAT_LOST else cause.since
            DETECTION_TO_CORDON.labels(cause.condition.split(":")[0]).observe(max(0.0, (now - began).total_seconds()))
            events.append(f"cordoned: {cause.condition} on {cause.target}")
    if rules.DRAIN in todo:
        cause = next(a for a in new if rules.DRAIN in a.classifications)
        at = last_seen if cause.condition == rules.HEARTBEAT_LOST else min(cause.since, now)
        n = await interrupt_all(uow, node_id, rules.category(cause.condition), cause.message, at)
        events.append(f"drained: {n} allocation(s) interrupted ({cause.condition})")
        if node_id in monitor.drained_at:
            INTERRUPTION_INTERVAL.observe((now - monitor.drained_at[node_id]).total_seconds())
        monitor.drained_at[node_id] = now
    if row["draining"] and row["drain_deadline"] is not None and now >= row["drain_deadline"]:
        n = await interrupt_all(uow, node_id, "maintenance", "the node's drain deadline passed", now)
        events.append(f"drain deadline passed: {n} allocation(s) interrupted")
        row = {**row, "drain_deadline": None}
    if stray and monitor.may_fence(node_id):
        await uow.emit("node_agent.fence_instances", FenceInstances(
            node_id=node_id, allocation_ids=sorted(stray), reason="these allocations run on another node now"),
            correlation_id=str(node_id), subject_params={"node_id": str(node_id)})
        events.append(f"fencing {len(stray)} instance(s) of allocations placed elsewhere")
    if (state == rules.HEALTHY and cordoned and cordoned_by == rules.HEARTBEAT_LOST
            and not any(set(a.classifications) & rules.CORDONING for a in alerts)):
        await set_cordon(uow, active, node_id, False)
        cordoned_by = None
        events.append("uncordoned: the node answers again and holds nothing placed elsewhere")
    if state != row["state"]:
        events.insert(0, f"{row['state']} → {state}")
    docs = [_as_doc(a) for a in alerts]
    if not events and [tuple(_key(a)) for a in alerts] == [tuple(_key(a)) for a in _alerts(
            {"alerts": row["alerts"]}, policy)]:
        return
    saved = await store.save(uow.conn, node_id, {
        "state": state, "since": now if state != row["state"] else row["since"], "last_seen": last_seen,
        "alerts": docs, "acted": [_key(a) for a in alerts], "cordoned_by": cordoned_by,
        "draining": row["draining"] and cordoned, "drain_deadline": row["drain_deadline"] if cordoned else None,
    }, "; ".join(events) or "alerts changed")
    saved["pool"] = row["pool"]
    log.info("scheduler.node_health", node_id=str(node_id), state=state, events=events)
    await publish(uow, saved, "; ".join(events) or "alerts changed", breaker_open)


async def evaluate(rt, active: ActiveScheduler, monitor: HealthMonitor) -> int:
    """Judge every watched node (the leader's periodic step), each in a transaction of its own (a node whose
    judgement fails is logged and judged again next time; the others go on); a first heartbeat starts watching
    its node. Returns how many nodes were judged."""
    if active.sched is None:
        return 0
    now = utcnow()
    if monitor.leading_since is None:
        monitor.leading_since = now
    async with rt.pool.acquire() as conn:
        watched = await store.monitored(conn)
        started = [n for n in monitor.beats.keys() - watched.keys()
                   if await store.start_watching(conn, n, monitor.beats[n][0])]
        if started:   # read again only when a first heartbeat added a node
            watched = await store.monitored(conn)
        policy = await store.policy(conn)
    for state in rules.STATES:
        NODE_STATE.labels(state).set(sum(1 for r in watched.values() if r["state"] == state))
    judged = 0
    for node_id, seen in watched.items():
        if not worth_judging(assess(monitor, seen, policy, now), seen, active, now):
            continue
        try:
            async with rt.consumers.exclusive:   # cordons change the index: never inside another batch
                async with UnitOfWork.begin(rt.pool, rt.outbox, name="scheduler.health") as uow:
                    row = await store.node(uow.conn, node_id, lock=True)
                    if row is not None:
                        await judge(uow, active, monitor, row, policy, utcnow())
            judged += 1
        except Exception as exc:   # noqa: BLE001 — one node's failure must not blind the monitor to the others
            active.needs_reload = True
            log.error("scheduler.health_judgement_failed", node_id=str(node_id), error=repr(exc))
    return judged


# --- the provider's commands ------------------------------------------------------------------------------------
async def set_health_policy(ctx: UnitOfWork, cmd: c.SetHealthPolicy, *, active: ActiveScheduler) -> None:
    """Set one condition's classifications; ``scheduler.health_policy_changed`` carries the row."""
    row = await store.set_policy(ctx.conn, cmd.condition, list(dict.fromkeys(cmd.classifications)), cmd.note)
    await ctx.emit("scheduler.health_policy_changed", c.HealthPolicyChanged(**row, requested_by=cmd.requested_by))


async def drain_node(ctx: UnitOfWork, cmd: c.DrainNode, *, active: ActiveScheduler) -> None:
    """Cordon the node and interrupt its allocations now, or at the deadline (those that end before it, end)."""
    await active.ensure_loaded()
    repo = active.repository(ctx.conn)

    async def body() -> None:
        node = await known_node(repo, cmd.node_id)
        if cmd.mode == "deadline" and cmd.deadline <= utcnow():
            raise Rejected("the drain deadline has passed already")
        now = utcnow()
        await ctx.conn.execute("INSERT INTO node_health (node_id, state, since) VALUES ($1, 'unknown', $2) "
                               "ON CONFLICT DO NOTHING", cmd.node_id, now)
        if not node["cordoned"]:
            await set_cordon(ctx, active, cmd.node_id, True)
        event = f"drain ({cmd.mode}) by a provider admin: {cmd.reason}"
        if cmd.mode == "now":
            n = await interrupt_all(ctx, cmd.node_id, "maintenance", cmd.reason, now)
            event += f"; {n} allocation(s) interrupted"
        saved = await store.save(ctx.conn, cmd.node_id, {"draining": True, "drain_deadline": cmd.deadline}, event)
        saved["pool"] = node["pool"]
        await publish(ctx, saved, event)
    await admin(ctx, repo, "scheduler.drain_node", str(cmd.node_id), body)


async def end_drain(uow: UnitOfWork, node_id: uuid.UUID) -> None:
    """A provider admin uncordoned the node: its drain (if any) ends with the cordon, in the same transaction, and
    the health view says so (it would otherwise show the node draining until health next judged a change)."""
    row = await store.node(uow.conn, node_id, lock=True)
    if row is None or not row["draining"]:
        return
    event = "uncordoned by a provider admin: the drain ended"
    saved = await store.save(uow.conn, node_id, {"draining": False, "drain_deadline": None}, event)
    saved["pool"] = row["pool"]
    await publish(uow, saved, event)


async def close_breaker(ctx: UnitOfWork, cmd: c.CloseBreaker, *, active: ActiveScheduler) -> None:
    """Close the pool's breaker: health cordons there again (what it skipped while open is not done now)."""
    await store.breaker(ctx.conn, cmd.pool)
    row = await store.save_breaker(ctx.conn, cmd.pool, False, None, [])
    BREAKER_OPEN.labels(cmd.pool).set(0)
    await emit_breaker(ctx, row, active.settings, utcnow())
