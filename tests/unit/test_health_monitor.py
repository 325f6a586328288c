"""The monitor's cheap pre-check: a node whose heartbeat says nothing new opens no transaction."""
import uuid
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from services.scheduler.handlers.health import HealthMonitor, assess, worth_judging
from services.scheduler.settings import SchedulerSettings

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
NODE = uuid.uuid4()


def _row(**kw) -> dict:
    return {"node_id": NODE, "state": "healthy", "last_seen": NOW - timedelta(seconds=1), "alerts": [], "acted": [],
            "cordoned": False, "cordoned_by": None, "draining": False, "drain_deadline": None, **kw}


def _active(holdings: dict) -> SimpleNamespace:
    inv = SimpleNamespace(holding=lambda a: holdings.get(a))
    return SimpleNamespace(sched=SimpleNamespace(inv=inv))


def _monitor(instances=(), alerts=(), age_s=0.5) -> HealthMonitor:
    m = HealthMonitor(SchedulerSettings(heartbeat_timeout_s=4.0))
    m.leading_since = NOW - timedelta(seconds=60)
    m.beats[NODE] = (NOW - timedelta(seconds=age_s), {"node_id": str(NODE), "alerts": list(alerts),
                                                      "instances": [str(i) for i in instances]})
    return m


def test_a_healthy_node_holding_what_is_placed_on_it_is_not_judged():
    alloc = uuid.uuid4()
    m = _monitor(instances=[alloc])
    active = _active({alloc: (None, SimpleNamespace(node_id=NODE))})
    assert not worth_judging(assess(m, _row(), {}, NOW), _row(), active, NOW)


def test_an_instance_placed_elsewhere_a_new_alert_or_silence_is_judged():
    alloc = uuid.uuid4()
    elsewhere = _active({alloc: (None, SimpleNamespace(node_id=uuid.uuid4()))})
    m = _monitor(instances=[alloc])
    assert worth_judging(assess(m, _row(), {}, NOW), _row(), elsewhere, NOW)
    xid = {"source": "sim", "target": "gpu:0", "condition": "xid:79", "since": NOW.isoformat(), "message": "m",
           "tenant_message": "t"}
    m = _monitor(alerts=[xid])
    assert worth_judging(assess(m, _row(), {}, NOW), _row(), _active({}), NOW)
    m = _monitor(age_s=5)                       # one timeout without a heartbeat: suspect
    silent = _row(last_seen=NOW - timedelta(seconds=5))
    assert worth_judging(assess(m, silent, {}, NOW), silent, _active({}), NOW)


def test_a_node_never_heard_from_is_judged_only_for_its_drain_deadline():
    m = HealthMonitor(SchedulerSettings())
    row = _row(state="unknown", last_seen=None)
    assert not worth_judging(assess(m, row, {}, NOW), row, _active({}), NOW)
    due = _row(state="unknown", last_seen=None, draining=True, drain_deadline=NOW - timedelta(seconds=1))
    assert worth_judging(assess(m, due, {}, NOW), due, _active({}), NOW)
