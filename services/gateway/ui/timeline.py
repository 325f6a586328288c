"""An allocation's saga as a timeline: each step, its duration and its compensation, from the saga coordinator
(``read_steps``, the same read as GET /v1/allocations/{id}/steps). When the coordinator cannot answer (or this
gateway has no such read), the allocation's stored events stand in: the ``saga.step_changed`` events name each
step and status, the others its state changes."""
from __future__ import annotations

import json
from datetime import datetime

import structlog

from ..adapters import dashboard as repo
from ..api.allocations.steps import read_steps
from ..http.problems import ProblemError

log = structlog.get_logger()
EVENTS_SHOWN = 500   # an allocation's stored events shown as its timeline, oldest first


async def timeline(gw, allocation) -> dict:
    """{"source": "saga" | "events", "sagas": [...]} in the steps endpoint's shape (times as text); the stored
    events are read only when the coordinator cannot answer."""
    try:
        answer = await read_steps(gw, allocation["id"])
        return {"source": "saga", "sagas": answer.get("items", [])}
    except ProblemError as exc:   # the coordinator is away: the stored events still tell the story
        log.info("ui.steps_unavailable", allocation_id=str(allocation["id"]), status=exc.status)
    async with gw.pool.acquire() as conn:
        events = await repo.allocation_events(conn, allocation["id"], EVENTS_SHOWN)
    return {"source": "events", "sagas": [from_events(events)]}


def from_events(events: list) -> dict:
    """One pseudo-saga whose steps are the allocation's events in order: a saga step's status as reported, any
    other event as a completed step named by its type; each step's duration is the time until the next event."""
    steps = []
    for i, e in enumerate(events):
        env = json.loads(e["envelope"]) if isinstance(e["envelope"], str) else dict(e["envelope"])
        data = env.get("data") or {}
        at: datetime = e["recorded_at"]
        nxt = events[i + 1]["recorded_at"] if i + 1 < len(events) else None
        is_step = e["type"] == "saga.step_changed"
        steps.append({"step": data.get("step") if is_step else e["type"],
                      "phase": "compensate" if is_step and data.get("status") == "compensated" else "forward",
                      "status": data.get("status", "done") if is_step else "done",
                      "attempt": data.get("attempt", 1) if is_step else 1,
                      "started_at": at.isoformat(), "finished_at": nxt.isoformat() if nxt else None,
                      "duration_s": (nxt - at).total_seconds() if nxt else None, "error": data.get("error")})
    return {"saga_id": None, "kind": "events", "state": "", "started_at": steps[0]["started_at"] if steps else None,
            "finished_at": None, "steps": steps}


def rows(saga: dict) -> list[dict]:
    """The saga's forward steps in order, each with its compensation (None while it has none but an armed one),
    for the timeline table; ``share`` is the step's part of the longest step's duration (the bar)."""
    out: list[dict] = []
    by_step: dict[str, dict] = {}
    for st in saga.get("steps", []):
        if st.get("phase") == "compensate":
            row = by_step.get(st["step"])
            if row is not None and st.get("status") != "armed":
                row["compensation"] = st
            continue
        row = {**st, "compensation": None}
        by_step[st["step"]] = row
        out.append(row)
    longest = max((r["duration_s"] or 0 for r in out), default=0) or 1
    for r in out:
        r["share"] = round((r["duration_s"] or 0) / longest, 3)
    return out
