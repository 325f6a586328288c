"""Provider-admin definitions: capacity shapes, node pools and quotas. Each change emits its whole
document (``*_changed``); an invalid one emits ``scheduler.admin_command_rejected`` and changes nothing.
Lowering a quota below current use blocks new allocations and never evicts; raising one re-evaluates
the queue."""
from __future__ import annotations

from shared.unit_of_work import UnitOfWork

from .. import contracts as c
from ..adapters.catalog import quota_document
from ..domain.shapes import Shape, ShapeError
from .active import ActiveScheduler
from .common import Rejected, admin, quota_target
from .placing import place_waiting


async def define_shape(ctx: UnitOfWork, cmd: c.DefineShape, *, active: ActiveScheduler) -> None:
    """Create, change or delete (``deleted``) a shape. Rejected: a definition the domain refuses; deleting a
    shape that allocations use (placed or queued: the reason names how many) or the platform's last live
    shape. This is the authoritative check (the gateway's is an early answer from its read model): it
    waits for the claims of the shape in flight and counts what committed (the repository's shape_users), and a
    claim or queue entry of the shape after the deletion is refused (``unknown-shape``)."""
    await active.ensure_loaded()
    store = active.repository(ctx.conn)
    async def body() -> None:
        try:
            shape = Shape(cmd.name, cmd.kind, cmd.gpu_count, cmd.gpu_model, cmd.mig_profile)
        except ShapeError as exc:
            raise Rejected(str(exc)) from None
        if cmd.deleted:
            users, others = await store.shape_users(cmd.name)
            if users:
                raise Rejected(f"shape {cmd.name!r} is in use by {users} allocation(s) (placed or queued); "
                               "delete it once they are released")
            if not others:
                raise Rejected(f"shape {cmd.name!r} is the platform's last shape; define another before deleting it")
        row = await store.upsert_shape(cmd.model_dump())
        await ctx.emit("scheduler.shape_changed", c.ShapeChanged(**{k: row[k] for k in c.ShapeChanged.model_fields}))
        active.apply_shape(shape, deleted=cmd.deleted)
    await admin(ctx, store, "scheduler.define_shape", cmd.name, body)


async def define_pool(ctx: UnitOfWork, cmd: c.DefinePool, *, active: ActiveScheduler) -> None:
    """Create or change a pool (policy, taints)."""
    await active.ensure_loaded()
    store = active.repository(ctx.conn)
    async def body() -> None:
        row = await store.upsert_pool(cmd.model_dump())
        await ctx.emit("scheduler.pool_changed", c.PoolChanged(**{k: row[k] for k in c.PoolChanged.model_fields}))
        active.apply_pool(row)
        await place_waiting(ctx, active)
    await admin(ctx, store, "scheduler.define_pool", cmd.name, body)


async def set_quota(ctx: UnitOfWork, cmd: c.SetQuota, *, active: ActiveScheduler) -> None:
    """Set a tenant's (or, with ``user_id``, one user's) limit and guarantee for a model in a pool.
    Rejected: an unknown pool, a guarantee above the limit."""
    await active.ensure_loaded()
    store = active.repository(ctx.conn)
    target = quota_target(cmd)

    async def body() -> None:
        if not await store.pool_exists(cmd.pool):
            raise Rejected(f"unknown pool {cmd.pool!r}")
        if cmd.guaranteed > cmd.limit:
            raise Rejected(f"guaranteed {cmd.guaranteed} is above the limit {cmd.limit}")
        row = await store.set_quota(cmd.tenant_id, cmd.gpu_model, cmd.pool, cmd.user_id,
                                      cmd.limit, cmd.guaranteed)
        await ctx.emit("scheduler.quota_changed", c.QuotaChanged(**quota_document(row)),
                       tenant_id=cmd.tenant_id)
        active.apply_quota(row)
        await place_waiting(ctx, active)
    await admin(ctx, store, "scheduler.set_quota", target, body)
