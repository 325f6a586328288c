"""An allocation's sagas as a timeline (``saga.read_steps``): each saga's step records in the order its
definition runs them, each undo right after its step, with how long each took. Pure; the rows come from
``adapters.timeline``."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from .definitions import DEFINITIONS


def duration_s(started_at: datetime | None, finished_at: datetime | None) -> float | None:
    """Seconds between start and finish; None while it runs (or when it never ran)."""
    if started_at is None or finished_at is None:
        return None
    return round((finished_at - started_at).total_seconds(), 6)


def ordered(kind: str, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``records`` (step, phase, ...) in the definition's order of ``kind``, the invoke before the undo; a step
    the definition no longer names (a record older than a change of it) comes last, by name."""
    definition = DEFINITIONS.get(kind)
    rank = {name: i for i, name in enumerate(definition.names if definition else [])}
    return sorted(records, key=lambda r: (rank.get(r["step"], len(rank)), r["step"], r["phase"] != "invoke"))


def saga_steps(saga: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, Any]:
    """One saga of the timeline: its own fields (saga_id, kind, state, started_at, finished_at) and its
    records, ordered, each with its duration."""
    steps = [{"step": r["step"], "phase": r["phase"], "status": r["status"], "attempt": r["attempt"],
              "started_at": r["started_at"], "finished_at": r["finished_at"],
              "duration_s": duration_s(r["started_at"], r["finished_at"]), "error": r["error"]}
             for r in ordered(saga["kind"], records)]
    return {**saga, "steps": steps}
