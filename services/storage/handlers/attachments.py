"""Live attach and detach: a volume mounted into (or out of) a running allocation's slots by its node.

Attach records the attachment ``attaching``, lets the slot's address in on the backend and sends the node
``node_agent.mount_volume``; the node's ``node_agent.volume_mount_changed`` then makes it ``attached`` (the
volume ``in-use``) or ``failed`` with the node's reason (the address let out again). Detach marks it
``detaching`` and sends ``node_agent.unmount_volume``; once the node reports the volume unmounted the attachment
is removed and the address let out. An attachment without a node (or a failed one) is removed at once.
Reports can cross (a mount's late success after a detach began): each is read as what the node says is
mounted now (see ``volume_mount_changed``).

Every change publishes the whole volume (``storage.volume_changed``); a refused attach (the volume is attached
elsewhere and not shared, not available, the backend's refusal) only sets its ``reason``.
"""
from __future__ import annotations

import structlog

from services.node_agent.contracts import MountVolume, UnmountVolume, VolumeMountChanged
from shared.refusals import PermanentError
from shared.unit_of_work import UnitOfWork

from .. import contracts as c
from ..adapters.backends.base import BackendError
from ..adapters.repository import PgVolumeRepository
from ..domain.model import Refused
from .lifecycle import Backends, RepositoryFactory, backend_of, changed, export, publish, release

log = structlog.get_logger()


async def attach_volume(ctx: UnitOfWork, cmd: c.AttachVolume, *, backends: Backends,
                        repository: RepositoryFactory = PgVolumeRepository) -> None:
    """Attach the volume to the running allocation and ask its node to mount it (idempotent)."""
    volumes = repository(ctx.conn)
    v = await volumes.get(cmd.volume_id, for_update=True)
    if v is None or v.tenant_id != cmd.tenant_id:
        raise PermanentError(f"volume {cmd.volume_id} not found")
    try:
        if v.check_attach(cmd.tenant_id, cmd.allocation_id) is not None:
            return await publish(ctx, v)   # attached (or attaching) already
        if cmd.ip_address:
            await backend_of(backends, v).allow(v.id, (cmd.ip_address,), read_only=cmd.mode == "ro")
    except (Refused, BackendError) as exc:
        return await changed(ctx, volumes, v, reason=str(exc))
    v.attach(cmd.allocation_id, cmd.mode, "attaching", node_id=cmd.node_id, client=cmd.ip_address)
    await changed(ctx, volumes, v)
    await ctx.emit("node_agent.mount_volume", MountVolume(allocation_id=cmd.allocation_id, tenant_id=cmd.tenant_id,
                                                          export=export(v, cmd.mode)),
                   subject_params={"node_id": str(cmd.node_id)}, tenant_id=cmd.tenant_id)


async def detach_volume(ctx: UnitOfWork, cmd: c.DetachVolume, *, backends: Backends,
                        repository: RepositoryFactory = PgVolumeRepository) -> None:
    """Ask the allocation's node to unmount the volume (directly detached when no node is known or the
    attachment failed); detaching what is not attached changes nothing."""
    volumes = repository(ctx.conn)
    v = await volumes.get(cmd.volume_id, for_update=True)
    if v is None or v.tenant_id != cmd.tenant_id:
        raise PermanentError(f"volume {cmd.volume_id} not found")
    att = v.attachment(cmd.allocation_id)
    if att is None or att.state == "detaching":
        return await publish(ctx, v)
    if att.node_id is None or att.state == "failed":
        await release(backends, v, cmd.allocation_id)
        return await changed(ctx, volumes, v)
    att.state, att.reason = "detaching", None
    await changed(ctx, volumes, v)
    await ctx.emit("node_agent.unmount_volume", UnmountVolume(allocation_id=cmd.allocation_id,
                                                              tenant_id=cmd.tenant_id, volume_id=v.id),
                   subject_params={"node_id": str(att.node_id)}, tenant_id=cmd.tenant_id)


async def volume_mount_changed(ctx: UnitOfWork, evt: VolumeMountChanged, *, backends: Backends,
                               repository: RepositoryFactory = PgVolumeRepository) -> None:
    """A node mounted or unmounted a volume (or could not): settle the attachment by what the node says is true
    now (``mounted``). Mounted: an attaching one is attached; a detaching one stays detaching when the report is
    the mount's late success (ok), and is attached again with the reason when the unmount failed. Not mounted:
    an attaching one failed (reason kept, the address let out); any other is removed (the address let out). A
    report that changes nothing (a repeat, one about an attachment that is gone or failed) is ignored."""
    volumes = repository(ctx.conn)
    v = await volumes.get(evt.volume_id, for_update=True)
    att = v.attachment(evt.allocation_id) if v is not None and v.tenant_id == evt.tenant_id else None
    late_mount = att is not None and att.state == "detaching" and evt.mounted and evt.ok
    if att is None or att.state == "failed" or late_mount or (att.state == "attached" and evt.mounted):
        log.info("storage.mount_report_ignored", volume_id=str(evt.volume_id), allocation_id=str(evt.allocation_id),
                 mounted=evt.mounted, ok=evt.ok, state=att.state if att else None)
        return
    if evt.mounted:
        reason = None if att.state == "attaching" else (evt.reason or "the node could not unmount the volume")
        att.state, att.reason = "attached", reason
        return await changed(ctx, volumes, v, reason=reason)
    await release(backends, v, evt.allocation_id)
    if att.state != "attaching":
        return await changed(ctx, volumes, v)
    reason = evt.reason or "the node could not mount the volume"
    v.attach(evt.allocation_id, att.mode, "failed", node_id=att.node_id, client=None).reason = reason
    await changed(ctx, volumes, v, reason=reason)
