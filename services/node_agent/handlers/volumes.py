"""The node-agent's handlers for volumes mounted live: storage's ``node_agent.mount_volume`` and
``node_agent.unmount_volume`` on a running allocation's slots (its attach and detach of a volume).

Each runs in the consumer's transaction under the allocation's lock (never beside its provision or deprovision)
and always answers ``node_agent.volume_mount_changed``: ok with the Mount (where and how the slots see it), or
ok false with the reason (no instance of the allocation here, another tenant's allocation, a volume refused, the
driver's error), and whether the volume is mounted now. A refusal is never silent.

The provision command kept with the instance follows (its ``volumes``), so an instance the reconcile makes again
gets the volumes it had, and only those. A VM is not told of a live mount: its tenant mounts it by the tag in the
reply's Mount (``mount -t virtiofs <tag> /mnt/<name>``).
"""
from __future__ import annotations

import uuid

import structlog

from shared.unit_of_work import UnitOfWork

from .. import contracts as c
from ..adapters.drivers import DriverError
from ..domain.model import InvalidRequest
from ..domain.ports import NodeRecords
from .instances import tenants_instance
from .node import Node
from .spec import volumes

log = structlog.get_logger()


async def mount_volume(ctx: UnitOfWork, cmd: c.MountVolume, *, node: Node) -> None:
    """Mount the export into the allocation's instance; answer volume_mount_changed (ok, or the reason)."""
    records, command, reason = await _locked(ctx, node, cmd)
    mount = None
    if reason is None:
        try:
            [volume] = volumes([cmd.export])
            mount = c.Mount(**(await node.driver.mount(cmd.allocation_id, volume)).info())
        except (InvalidRequest, DriverError) as exc:
            reason = str(exc)
        else:
            await _keep(records, command, add=cmd.export)
    await _answer(ctx, node, cmd, cmd.export.volume_id, mounted=mount is not None, reason=reason, mount=mount)


async def unmount_volume(ctx: UnitOfWork, cmd: c.UnmountVolume, *, node: Node) -> None:
    """Unmount the volume from the allocation's instance (idempotent); answer volume_mount_changed."""
    records, command, reason = await _locked(ctx, node, cmd)
    mounted = False
    if reason is None:
        try:
            await node.driver.unmount(cmd.allocation_id, cmd.volume_id)
        except DriverError as exc:
            reason = str(exc)
            mounted = await _mounted(node, cmd.allocation_id, cmd.volume_id)
        else:
            await _keep(records, command, remove=cmd.volume_id)
    await _answer(ctx, node, cmd, cmd.volume_id, mounted=mounted, reason=reason)


async def _locked(ctx: UnitOfWork, node: Node, cmd: c.MountVolume | c.UnmountVolume
                  ) -> tuple[NodeRecords, str | None, str | None]:
    """The node's records with the allocation locked (one volume change at a time), its provision command, and
    why the command cannot apply here (None: the tenant's instance runs on this node)."""
    records = node.records(ctx.conn)
    await records.lock_allocation(cmd.allocation_id)
    command = await records.command_of(cmd.allocation_id)
    if tenants_instance(command, cmd.tenant_id):
        return records, command, None
    return records, command, f"allocation {cmd.allocation_id} has no instance on node {node.id}"


async def _mounted(node: Node, allocation_id: uuid.UUID, volume_id: uuid.UUID) -> bool:
    try:
        mounts = (await node.driver.instance_info(allocation_id)).get("mounts", [])
    except DriverError:
        return False
    return any(m["volume_id"] == str(volume_id) for m in mounts)


async def _keep(records: NodeRecords, command: str, *, add=None, remove: uuid.UUID | None = None) -> None:
    """The kept provision command with the volume added (replacing one of its id) or removed."""
    cmd = c.ProvisionNode.model_validate_json(command)
    gone = add.volume_id if add is not None else remove
    kept = [v for v in cmd.volumes if v.volume_id != gone] + ([add] if add is not None else [])
    await records.keep_command(cmd.model_copy(update={"volumes": kept}))


async def _answer(ctx: UnitOfWork, node: Node, cmd: c.MountVolume | c.UnmountVolume, volume_id: uuid.UUID, *,
                  mounted: bool, reason: str | None, mount: c.Mount | None = None) -> None:
    log.info("node_agent.volume_mount_changed", allocation_id=str(cmd.allocation_id), volume_id=str(volume_id),
             verb="mount" if isinstance(cmd, c.MountVolume) else "unmount", ok=reason is None, mounted=mounted,
             reason=reason)
    await ctx.emit("node_agent.volume_mount_changed", c.VolumeMountChanged(
        node_id=node.id, allocation_id=cmd.allocation_id, tenant_id=cmd.tenant_id, volume_id=volume_id,
        mounted=mounted, ok=reason is None, reason=reason[:2000] if reason else None, mount=mount),
        subject_params=node.subject_params, tenant_id=cmd.tenant_id)


def volume_refused(node: Node):
    """The volume subscriptions' ``on_refused``: a command no retry can carry out (data PostgreSQL refuses) is
    answered volume_mount_changed ok=false with the reason at once, so storage's attach or detach does not hang."""
    async def on_refused(ctx: UnitOfWork, cmd: c.MountVolume | c.UnmountVolume, reason: str) -> None:
        if isinstance(cmd, c.MountVolume):   # nothing was done: not mounted by this command
            await _answer(ctx, node, cmd, cmd.export.volume_id, mounted=False, reason=reason)
        else:                                # nothing was done: it is as it was
            await _answer(ctx, node, cmd, cmd.volume_id, reason=reason,
                          mounted=await _mounted(node, cmd.allocation_id, cmd.volume_id))
    return on_refused
