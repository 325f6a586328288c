"""The scheduler's repository port over dicts (no I/O), and a pool whose connections hold step outcomes.

FakeSchedulerRepository  nodes, slots, shapes, pools, quotas, holdings, the queue and preemptions in memory; the
                         claim is all or nothing with the schema's conditions (shape live, quota room, slots free,
                         node schedulable and not cordoned); whole GPUs only (no MIG). ``snapshot``/``restore``
                         make its savepoints (and a StepConnection's) undo what a refused block wrote.
FakePool                 what ``ActiveScheduler.load`` and a later unit of work acquire: one StepConnection
"""
from __future__ import annotations

import contextlib
import copy
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

from services.scheduler.domain.claims import NIL, Claim, QuotaExceeded, ShapeDeleted, SlotTaken, quota_name
from services.scheduler.domain.ports import Row, SchedulerRepository
from tests.support.steps import Snapshots, StepConnection

_NODE_DEFAULTS = {"pool": "shared", "region": "region-1", "site": "site-1", "rack": "rack-1", "labels": {},
                  "taints": {}, "cordoned": False, "declared": True, "status": "registered", "driver": None,
                  "topology": None, "proposal": 0, "proposed_slot_map": None, "approved_slot_map": None,
                  "review": [], "burn_in": None, "version": 1}


class FakeSchedulerRepository(Snapshots, SchedulerRepository):
    def __init__(self) -> None:
        self.nodes_: dict[uuid.UUID, Row] = {}
        self.slots: dict[tuple[uuid.UUID, int], Row] = {}      # (node, idx) -> detail, wipe_policy, allocation...
        self.seq: dict[uuid.UUID, int] = {}                     # capacity sequence per node
        self.shapes_: dict[str, Row] = {}
        self.pools_: dict[str, Row] = {}
        self.quotas_: dict[tuple, Row] = {}                     # (tenant, model, pool, user or NIL)
        self.allocations: dict[uuid.UUID, Row] = {}
        self.queue: dict[uuid.UUID, Row] = {}
        self.preemptions: dict[uuid.UUID, Row] = {}
        self.gangs: dict[uuid.UUID, Row] = {}

    # --- nodes
    def _free(self, node_id: uuid.UUID) -> int:
        return sum(1 for (n, _), s in self.slots.items() if n == node_id and s["allocation_id"] is None
                   and s["wipe_policy"] and not s["retired"])

    async def node(self, node_id: uuid.UUID, *, lock: bool = False) -> Row | None:
        row = self.nodes_.get(node_id)
        if row is None:
            return None
        out = [{"slot": i, "reason": s["quarantine_reason"], "since": None}
               for (n, i), s in sorted(self.slots.items(), key=lambda kv: kv[0][1]) if n == node_id and s["quarantine_reason"]]
        return copy.deepcopy({**row, "quarantined": out})

    async def nodes(self) -> list[Row]:
        return [await self.node(n) for n in sorted(self.nodes_, key=lambda n: self.nodes_[n]["name"])]

    async def node_name_holder(self, name: str) -> uuid.UUID | None:
        return next((n for n, row in self.nodes_.items() if row["name"] == name), None)

    async def insert_node(self, node_id: uuid.UUID, fields: Row) -> bool:
        if node_id in self.nodes_ or await self.node_name_holder(fields["name"]) is not None:
            return False
        self.nodes_[node_id] = copy.deepcopy({**_NODE_DEFAULTS, **fields, "id": node_id})
        return True

    async def update_node(self, node_id: uuid.UUID, fields: Row) -> None:
        unknown = set(fields) - (set(_NODE_DEFAULTS) - {"version"} | {"name", "gpu_model", "gpu_count"})
        if unknown:
            raise ValueError(f"not node columns: {sorted(unknown)}")
        row = self.nodes_[node_id]
        row.update(copy.deepcopy(fields))
        row["version"] += 1

    async def node_document(self, node_id: uuid.UUID) -> Row:
        d, free = await self.node(node_id), self._free(node_id)
        return {"node_id": node_id, **{k: d[k] for k in ("name", "status", "pool", "region", "site", "rack",
                                                         "gpu_model", "gpu_count", "labels", "taints", "cordoned",
                                                         "proposed_slot_map", "approved_slot_map", "review",
                                                         "quarantined", "burn_in", "version")},
                "proposal": d["proposal"] if d["proposed_slot_map"] is not None else None,
                "free_slots": free if d["status"] == "schedulable" else 0,
                "capacity": {"free_slots": free, "seq": self.seq.get(node_id, 0)}}

    async def install_slots(self, node_id: uuid.UUID, slots: list[Row]) -> None:
        wanted = {s["index"] for s in slots}
        for s in slots:
            old = self.slots.get((node_id, s["index"]), {"allocation_id": None, "quarantine_reason": None})
            self.slots[(node_id, s["index"])] = {**old, "detail": s, "retired": False,
                                                 "wipe_policy": "" if old["quarantine_reason"] else s.get("wipe_policy") or ""}
        for key, s in list(self.slots.items()):
            if key[0] == node_id and key[1] not in wanted:
                if s["allocation_id"] is None:
                    del self.slots[key]
                else:
                    s["retired"] = True
        await self.capacity_changed([node_id])

    async def quarantine_slots(self, node_id: uuid.UUID, reasons: dict[int, str]) -> list[int]:
        done = []
        for idx, reason in reasons.items():
            s = self.slots.get((node_id, idx))
            if s is not None and s["quarantine_reason"] is None:
                s.update(quarantine_reason=reason, wipe_policy="")
                done.append(idx)
        if done:
            self.nodes_[node_id]["version"] += 1
        return sorted(done)

    async def return_slot(self, node_id: uuid.UUID, slot: int) -> bool:
        s = self.slots.get((node_id, slot))
        if s is None or s["quarantine_reason"] is None:
            return False
        s.update(quarantine_reason=None, wipe_policy=s["detail"].get("wipe_policy") or "")
        self.nodes_[node_id]["version"] += 1
        await self.capacity_changed([node_id])
        return True

    async def renew_quarantine(self, node_id: uuid.UUID, slot: int, reason: str) -> bool:
        s = self.slots.get((node_id, slot))
        if s is None or s["quarantine_reason"] is None:
            return False
        s["quarantine_reason"] = reason
        self.nodes_[node_id]["version"] += 1
        return True

    # --- shapes, pools, quotas
    async def shapes(self) -> list[Row]:
        return copy.deepcopy(list(self.shapes_.values()))

    async def upsert_shape(self, shape: Row) -> Row:
        version = self.shapes_[shape["name"]]["version"] + 1 if shape["name"] in self.shapes_ else 1
        self.shapes_[shape["name"]] = {k: shape[k] for k in ("name", "kind", "gpu_count", "gpu_model", "mig_profile",
                                                              "deleted")} | {"version": version}
        return dict(self.shapes_[shape["name"]])

    async def pools(self) -> list[Row]:
        return copy.deepcopy(list(self.pools_.values()))

    async def pool_exists(self, name: str) -> bool:
        return name in self.pools_

    async def upsert_pool(self, pool: Row) -> Row:
        version = self.pools_[pool["name"]]["version"] + 1 if pool["name"] in self.pools_ else 1
        self.pools_[pool["name"]] = {k: pool[k] for k in ("name", "policy", "taints", "description")} | {"version": version}
        return copy.deepcopy(self.pools_[pool["name"]])

    async def quotas(self) -> list[Row]:
        return copy.deepcopy(list(self.quotas_.values()))

    async def set_quota(self, tenant_id, gpu_model, pool, user_id, limit, guaranteed) -> Row:
        key = (tenant_id, gpu_model, pool, user_id or NIL)
        row = self.quotas_.get(key)
        if row is None:
            used = sum(a["gpus"] for a in self.allocations.values() if (a["tenant_id"], a["gpu_model"], a["pool"]) ==
                       key[:3] and (user_id is None or a["user_id"] == user_id))
            row = self.quotas_[key] = {"tenant_id": tenant_id, "gpu_model": gpu_model, "pool": pool,
                                       "user_id": key[3], "used": used, "version": 0}
        row.update({"limit": limit, "guaranteed": guaranteed, "version": row["version"] + 1})
        return dict(row)

    async def quota_used(self, tenant_id, gpu_model, pool) -> int | None:
        row = self.quotas_.get((tenant_id, gpu_model, pool, NIL))
        return None if row is None else row["used"]

    def _quotas(self, tenant_id, gpu_model: str, pool: str, user_id) -> list[tuple[uuid.UUID, Row | None]]:
        """(who, quota row or None) a holding counts against: the tenant's own row, then the user's share if any."""
        return [(who, self.quotas_.get((tenant_id, gpu_model, pool, who)))
                for who in [NIL] + ([user_id] if user_id else [])]

    # --- holdings
    async def claim(self, c: Claim, *, count: bool = True) -> tuple[list[Row], Row | None]:
        assert c.mig_profile is None, "the fake claims whole GPUs only"
        if not (c.shape in self.shapes_ and not self.shapes_[c.shape]["deleted"]):
            raise ShapeDeleted(f"shape {c.shape!r} was deleted")
        quotas = self._quotas(c.tenant_id, c.gpu_model, c.pool, c.user_id)
        for who, q in quotas:
            if (q is None and who == NIL) or (q is not None and q["used"] + c.units > q["limit"]):
                raise QuotaExceeded(quota_name(c.tenant_id, c.gpu_model, c.pool, None if who == NIL else who),
                                    q and q["limit"], q["used"] if q else 0, c.units)
        slots = [self.slots.get((c.node_id, i)) for i in c.slots]
        node = self.nodes_.get(c.node_id)
        if any(s is None or s["allocation_id"] or not s["wipe_policy"] or s["retired"] for s in slots) or \
                node is None or node["status"] != "schedulable" or node["cordoned"]:
            raise SlotTaken(f"slots {list(c.slots)} of node {c.node_id} are not all free")
        for _, q in quotas:
            if q is not None:
                q["used"] += c.units
        for s in slots:
            s["allocation_id"] = c.allocation_id
        self.allocations[c.allocation_id] = {
            "allocation_id": c.allocation_id, "tenant_id": c.tenant_id, "user_id": c.user_id, "node_id": c.node_id,
            "slots": list(c.slots), "shape": c.shape, "gpu_model": c.gpu_model, "pool": c.pool, "gpus": c.units,
            "priority": c.priority, "spot": c.spot, "mig_profile": None, "placed_at": datetime.now(UTC)}
        details = [copy.deepcopy(s["detail"]) for s in slots]
        return details, (await self.capacity_changed([c.node_id]))[c.node_id] if count else None

    async def capacity_changed(self, node_ids) -> dict[uuid.UUID, Row]:
        for n in sorted(set(node_ids)):
            self.seq[n] = self.seq.get(n, 0) + 1
        return {n: await self.capacity(n) for n in sorted(set(node_ids))}

    async def capacity(self, node_id: uuid.UUID) -> Row:
        return {"free_slots": self._free(node_id), "seq": self.seq.get(node_id, 0)}

    async def held(self, allocation_id: uuid.UUID) -> Row | None:
        return copy.deepcopy(self.allocations.get(allocation_id))

    async def holdings(self, node_id=None, known=()) -> list[Row]:
        return [copy.deepcopy(a) for a in self.allocations.values()
                if node_id is None or (a["node_id"] == node_id and a["allocation_id"] not in known)]

    async def holdings_on(self, node_id: uuid.UUID) -> int:
        return len(await self.holdings(node_id))

    async def slot_details(self, node_id: uuid.UUID, slots: list[int]) -> list[Row]:
        return [copy.deepcopy(self.slots[(node_id, i)]["detail"]) for i in sorted(slots)]

    async def release(self, allocation_id: uuid.UUID) -> tuple[Row | None, Row | None]:
        row = self.allocations.pop(allocation_id, None)
        if row is None:
            return None, None
        for _, q in self._quotas(row["tenant_id"], row["gpu_model"], row["pool"], row["user_id"]):
            if q is not None:
                q["used"] = max(q["used"] - row["gpus"], 0)
        for s in self.slots.values():
            if s["allocation_id"] == allocation_id:
                s["allocation_id"] = None
        return row, (await self.capacity_changed([row["node_id"]]))[row["node_id"]]

    async def shape_users(self, name: str) -> tuple[int, int]:
        users = sum(a["shape"] == name for a in self.allocations.values()) + \
            sum(p["request"]["shape"] == name for p in self.queue.values())
        return users, sum(1 for s in self.shapes_.values() if not s["deleted"] and s["name"] != name)

    async def hold_shape(self, name: str) -> bool:
        return name in self.shapes_ and not self.shapes_[name]["deleted"]

    # --- the queue and preemptions
    async def enqueue(self, request: Row, correlation_id: str) -> datetime:
        alloc = uuid.UUID(str(request["allocation_id"]))
        if alloc not in self.queue:
            self.queue[alloc] = {"allocation_id": alloc, "tenant_id": uuid.UUID(str(request["tenant_id"])),
                                 "request": json.loads(json.dumps(request, default=str)),
                                 "correlation_id": correlation_id, "idempotency_key": request["idempotency_key"],
                                 "priority": request.get("priority", 0), "enqueued_at": datetime.now(UTC),
                                 "nominated_node": None}
        return self.queue[alloc]["enqueued_at"]

    async def pending(self, allocation_id: uuid.UUID, *, lock: bool = False) -> Row | None:
        return copy.deepcopy(self.queue.get(allocation_id))

    async def all_pending(self) -> list[Row]:
        return sorted(copy.deepcopy(list(self.queue.values())), key=lambda p: p["enqueued_at"])

    async def dequeue(self, allocation_id: uuid.UUID) -> Row | None:
        return self.queue.pop(allocation_id, None)

    async def standing(self, allocation_id: uuid.UUID) -> tuple[bool, Row | None]:
        held = self.allocations.get(allocation_id)
        return allocation_id in self.queue, None if held is None else json.loads(json.dumps(held, default=str))

    async def nominate(self, allocation_id: uuid.UUID, node_id: uuid.UUID | None) -> None:
        self.queue[allocation_id]["nominated_node"] = node_id

    async def record_preemption(self, victim: Row, preemptor: uuid.UUID, reason: str, grace_s: float) -> Row | None:
        if victim["allocation_id"] in self.preemptions:
            return None
        row = {"victim": victim["allocation_id"], "victim_tenant": victim["tenant_id"], "preemptor": preemptor,
               "node_id": victim["node_id"], "reason": reason,
               "grace_deadline": datetime.now(UTC) + timedelta(seconds=grace_s), "sent_at": None}
        self.preemptions[victim["allocation_id"]] = row
        return dict(row)

    async def preemption_pairs(self) -> list[tuple[uuid.UUID, uuid.UUID]]:
        return [(v, p["preemptor"]) for v, p in self.preemptions.items() if v in self.allocations]

    # --- gangs
    async def gang(self, gang_id: uuid.UUID, *, lock: bool = False) -> Row | None:
        return copy.deepcopy(self.gangs.get(gang_id))

    async def record_gang(self, request: Row, correlation_id: str, state: str, outcome: Row | None) -> Row:
        gid = uuid.UUID(str(request["gang_id"]))
        if gid not in self.gangs:
            self.gangs[gid] = {"gang_id": gid, "tenant_id": uuid.UUID(str(request["tenant_id"])),
                               "request": json.loads(json.dumps(request, default=str)), "correlation_id": correlation_id,
                               "state": state, "outcome": json.loads(json.dumps(outcome, default=str)),
                               "enqueued_at": datetime.now(UTC)}
        return copy.deepcopy(self.gangs[gid])

    async def decide_gang(self, gang_id: uuid.UUID, state: str, outcome: Row) -> bool:
        row = self.gangs.get(gang_id)
        if row is None or row["state"] != "queued":
            return False
        row.update(state=state, outcome=json.loads(json.dumps(outcome, default=str)))
        return True

    async def waiting_gangs(self) -> list[Row]:
        return sorted((copy.deepcopy(g) for g in self.gangs.values() if g["state"] == "queued"),
                      key=lambda g: g["enqueued_at"])


class FakePool:
    """Hands out one connection (the participant kit's step outcomes, savepoints over ``conn.fakes``)."""

    def __init__(self, conn: StepConnection):
        self.conn = conn

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[StepConnection]:
        yield self.conn
