"""The claim path: charge quota and take slots, conditionally, all or nothing (asyncpg + the schema's
``claim`` function, one round trip).

Why no slot is ever given twice and no quota ever overrun, whatever the in-memory index believed:
each UPDATE carries its own condition (a slot only ``WHERE allocation_id IS NULL``, a quota only
``WHERE used + n <= limit``, a tenant without a quota for (model, pool) may not allocate there) and
PostgreSQL re-checks that condition on the newest row version when a concurrent transaction committed
first. The affected row counts tell whether the claim held; if not, the function's subtransaction rolls
back and nothing of the claim remains. Lock order is always tenant quota row → user quota row → slot rows
(one UPDATE, index order), so concurrent claims cannot deadlock.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

import asyncpg

NIL = uuid.UUID(int=0)


class QuotaExceeded(Exception):
    def __init__(self, quota: str, limit: int | None, used: int, requested: int):
        super().__init__(f"no quota {quota}: the tenant may not allocate {requested} GPU(s) there" if limit is None
                         else f"quota {quota} exceeded: limit {limit}, in use {used}, requested {requested}")
        self.quota, self.limit, self.used, self.requested = quota, limit, used, requested


class SlotTaken(Exception):
    """The chosen slots were no longer free (the in-memory index was stale): nothing was claimed."""


@dataclass(frozen=True)
class Claim:
    allocation_id: uuid.UUID
    tenant_id: uuid.UUID
    user_id: uuid.UUID | None
    node_id: uuid.UUID
    slots: tuple[int, ...]
    shape: str
    gpu_model: str
    pool: str
    units: int                      # GPUs charged against quota
    priority: int = 0
    spot: bool = False
    mig_profile: str | None = None
    mig_per_gpu: int = 0


def quota_name(tenant_id, gpu_model: str, pool: str, user_id=None) -> str:
    """The readable name (the domain's QuotaKey.name, plus the user for a tenant admin's split)."""
    base = f"tenant/{tenant_id}/{gpu_model}/{pool}"
    return base if user_id in (None, NIL) else f"{base}/user/{user_id}"


async def claim(conn: asyncpg.Connection, c: Claim) -> tuple[list[dict], list[dict]]:
    """Charge quota, take the slots and record the allocation, all or nothing, in one round trip (the
    schema's ``claim`` function runs the conditional statements above in a subtransaction). Returns (slot
    details, []). Raises QuotaExceeded or SlotTaken, leaving nothing."""
    out = json.loads(await conn.fetchval(
        "SELECT claim($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13)", c.allocation_id, c.tenant_id, c.user_id,
        c.node_id, list(c.slots), c.shape, c.gpu_model, c.pool, c.units, c.priority, c.spot, c.mig_profile,
        c.mig_per_gpu))
    error = out.get("error")
    if error == "taken":
        raise SlotTaken(f"slots {list(c.slots)} of node {c.node_id} are not all free (or the node is not schedulable)")
    if error == "quota":
        raise QuotaExceeded(quota_name(c.tenant_id, c.gpu_model, c.pool, out["user"]), out["limit"], out["used"],
                            c.units)
    return out["details"], []


async def held(conn: asyncpg.Connection, allocation_id: uuid.UUID) -> dict | None:
    row = await conn.fetchrow("SELECT * FROM allocations WHERE allocation_id=$1", allocation_id)
    return dict(row) if row else None


async def slot_details(conn: asyncpg.Connection, node_id: uuid.UUID, slots: list[int]) -> list[dict]:
    rows = await conn.fetch("SELECT detail FROM slots WHERE node_id=$1 AND idx = ANY($2::int[]) ORDER BY idx",
                            node_id, slots)
    return [json.loads(r["detail"]) for r in rows]


async def release(conn: asyncpg.Connection, allocation_id: uuid.UUID) -> tuple[dict | None, list[dict]]:
    """Free what the allocation holds and refund its quota. Returns (the allocation row or None when it
    held nothing, the changed quota rows). Idempotent. Locks in the claim's order (quota rows, then slot
    rows): the reverse order deadlocked against a concurrent claim of the same tenant."""
    row = await conn.fetchrow("DELETE FROM allocations WHERE allocation_id=$1 RETURNING *", allocation_id)
    if row is None:
        return None, []
    quotas = await conn.fetch(
        "UPDATE quotas SET used = greatest(used - $5, 0), version = version + 1 WHERE tenant_id=$1 AND gpu_model=$2 "
        "AND pool=$3 AND user_id = ANY($4::uuid[]) RETURNING *",
        row["tenant_id"], row["gpu_model"], row["pool"], [NIL] + ([row["user_id"]] if row["user_id"] else []),
        row["gpus"])
    if row["mig_profile"]:
        await conn.execute(
            "UPDATE slots SET mig_used = mig_used - 1, mig_profile = CASE WHEN mig_used = 1 THEN NULL ELSE mig_profile END "
            "WHERE node_id=$1 AND idx = ANY($2::int[])", row["node_id"], row["slots"])
    else:
        await conn.execute("UPDATE slots SET allocation_id=NULL, reserved_at=NULL WHERE allocation_id=$1", allocation_id)
    return dict(row), [dict(q) for q in quotas]
