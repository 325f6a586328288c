"""The invariants a chaos run must keep, checked once the workload has stopped and the platform has settled.

Each check returns violations: one dict each, ``{"check": name, ...what it saw}``. The database checks read every
service's schema over a superuser connection; ``history_violations`` reads the allocation events the run recorded
(in stream order); ``dead_letter_violations`` the dead-letter stream against the faults injected.
"""
from __future__ import annotations

from collections.abc import Iterable

import asyncpg

from shared.contract import SERVICES
from tests.support.platform import NOTHING_LEFT, leftovers

STABLE = ("ACTIVE", "RELEASED", "FAILED")
# a dead letter counts as explained by a fault when it is written from the fault's start until this long after
# its end (a message redelivered until its deliveries ran out is dead-lettered up to a few ack waits later)
EXPLAINED_AFTER_S = 60.0


async def unstable_allocations(db: asyncpg.Connection) -> list[dict]:
    rows = await db.fetch("SELECT id, state, node_id FROM allocation.allocations WHERE state <> ALL($1::text[])",
                          list(STABLE))
    return [{"check": "allocation_not_stable", "allocation_id": str(r["id"]), "state": r["state"],
             "node_id": str(r["node_id"]) if r["node_id"] else None} for r in rows]


async def shared_slots(db: asyncpg.Connection) -> list[dict]:
    """No GPU of a node is held by two allocations: neither two instances on one node with a slot in common, nor
    a scheduler slot reserved for an allocation that is ACTIVE on another node."""
    rows = await db.fetch("""
        SELECT a.node_id, a.allocation_id AS a, b.allocation_id AS b, a.slots AS a_slots, b.slots AS b_slots
        FROM node_agent.instances a JOIN node_agent.instances b
          ON a.node_id = b.node_id AND a.allocation_id < b.allocation_id AND a.slots && b.slots""")
    found = [{"check": "slot_held_twice", "node_id": str(r["node_id"]), "allocations": [str(r["a"]), str(r["b"])],
              "slots": sorted(set(r["a_slots"]) & set(r["b_slots"]))} for r in rows]
    rows = await db.fetch("""
        SELECT s.node_id, s.idx, s.allocation_id, a.node_id AS active_on FROM scheduler.slots s
        JOIN allocation.allocations a ON a.id = s.allocation_id
        WHERE a.state = 'ACTIVE' AND a.node_id <> s.node_id""")
    found += [{"check": "slot_elsewhere", "allocation_id": str(r["allocation_id"]), "slot_node_id": str(r["node_id"]),
               "slot": r["idx"], "active_on": str(r["active_on"])} for r in rows]
    return found


async def quotas_exceeded(db: asyncpg.Connection) -> list[dict]:
    rows = await db.fetch('SELECT tenant_id, pool, gpu_model, used, "limit" FROM scheduler.quotas '
                          'WHERE used > "limit"')
    return [{"check": "quota_exceeded", "tenant_id": str(r["tenant_id"]), "pool": r["pool"],
             "gpu_model": r["gpu_model"], "used": r["used"], "limit": r["limit"]} for r in rows]


async def stranded(db: asyncpg.Connection) -> list[dict]:
    """What a service still holds for an allocation that is RELEASED or FAILED (each should hold nothing)."""
    ids = await db.fetch("SELECT id, state FROM allocation.allocations WHERE state IN ('RELEASED', 'FAILED')")
    found = []
    for r in ids:
        left = await leftovers(db, str(r["id"]))
        if left != NOTHING_LEFT:
            found.append({"check": "stranded", "allocation_id": str(r["id"]), "state": r["state"],
                          "held": {k: v for k, v in left.items() if v}})
    return found


async def undrained_outboxes(db: asyncpg.Connection) -> list[dict]:
    found = []
    for schema in SERVICES:
        exists = await db.fetchval("SELECT to_regclass($1) IS NOT NULL", f"{schema}.outbox")
        if not exists:
            continue
        n = await db.fetchval(f'SELECT count(*) FROM "{schema}".outbox WHERE published_at IS NULL')
        if n:
            found.append({"check": "outbox_not_drained", "schema": schema, "unpublished": n})
    return found


async def instances_on_two_nodes(db: asyncpg.Connection) -> list[dict]:
    rows = await db.fetch("SELECT allocation_id, array_agg(node_id::text ORDER BY node_id) AS nodes "
                          "FROM node_agent.instances GROUP BY allocation_id HAVING count(*) > 1")
    return [{"check": "instance_on_two_nodes", "allocation_id": str(r["allocation_id"]), "nodes": r["nodes"]}
            for r in rows]


async def database_violations(db: asyncpg.Connection) -> list[dict]:
    """Every check on the database, in one list."""
    found: list[dict] = []
    for check in (unstable_allocations, shared_slots, quotas_exceeded, stranded, undrained_outboxes,
                  instances_on_two_nodes):
        found += await check(db)
    return found


def history_violations(events: Iterable[dict]) -> list[dict]:
    """From the allocation events in stream order (``{"type", "data", "t"}``): no allocation runs on a second
    node while it still runs on the first. It runs on a node from its activation (or its reschedule there) until
    it is interrupted, released or failed; a reschedule must come from the node it ran on, or after an interrupt."""
    running: dict[str, str | None] = {}
    found = []
    for ev in events:
        data, kind = ev.get("data") or {}, ev["type"].rsplit(".", 1)[-1]
        aid = str(data.get("allocation_id"))
        now = running.get(aid)
        if kind == "activated":
            node = str(data["node_id"])
            if now is not None and now != node:
                found.append({"check": "two_nodes_at_once", "allocation_id": aid, "running_on": now,
                              "activated_on": node, "t": ev.get("t")})
            running[aid] = node
        elif kind == "rescheduled":
            source, target = str(data["from_node_id"]), str(data["to_node_id"])
            if now is not None and now not in (source, target):
                found.append({"check": "two_nodes_at_once", "allocation_id": aid, "running_on": now,
                              "rescheduled": [source, target], "t": ev.get("t")})
            running[aid] = target
        elif kind in ("interrupted", "released", "failed"):
            running[aid] = None
    return found


def explaining_fault(t: float, faults: Iterable[dict]) -> dict | None:
    """The first injected fault whose window (its start until EXPLAINED_AFTER_S after its end) holds ``t``
    (seconds since the run began)."""
    for f in faults:
        if f["at_s"] <= t <= f["at_s"] + f.get("duration_s", 0) + EXPLAINED_AFTER_S:
            return f
    return None


def dead_letter_violations(dead_letters: Iterable[dict], faults: list[dict]) -> list[dict]:
    """A dead letter (``{"t", "subject", "reason", "error"}``) that no injected fault explains is a violation;
    one that a fault explains is annotated with it (``explained_by``) in place."""
    found = []
    for dl in dead_letters:
        fault = explaining_fault(dl["t"], faults)
        if fault is None:
            found.append({"check": "dead_letter_unexplained", **dl})
        else:
            dl["explained_by"] = f"{fault['kind']} {fault.get('target', '')} at {fault['at_s']}s".strip()
    return found
