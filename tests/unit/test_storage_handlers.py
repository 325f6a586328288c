"""Storage's handlers over an in-memory repository and a recording backend (VAST's driver: its calls recorded,
no I/O): quota decisions, refusals that leave nothing on the backend, the saga step and its undo, live attach."""
from __future__ import annotations

import uuid

import pytest

from services.node_agent.contracts import VolumeMountChanged
from services.storage import contracts as c
from services.storage import handlers
from services.storage.adapters.backends.base import BackendError
from services.storage.adapters.backends.vast import VastBackend
from services.storage.domain.model import GB, StorageClass, StoragePolicy
from services.storage.domain.quota import Limits
from shared.participant import StepRejected
from shared.wire import step_key
from tests.support.fakes import FakeUnitOfWork, FakeVolumeRepository, factory

TENANT, USER = uuid.uuid4(), uuid.uuid4()
POLICY = StoragePolicy((StorageClass("standard", "vast", default=True),), default_quota_bytes=100 * GB,
                       default_quota_volumes=3)
IP = "10.0.0.5"


class RefusingBackend(VastBackend):
    """VAST's recording driver whose appliance refuses the actions named."""

    def __init__(self, *refused: str):
        super().__init__()
        self.refused = refused

    async def send(self, action, calls):
        if action in self.refused:
            raise BackendError(f"the appliance refused to {action}")
        await super().send(action, calls)


def create_cmd(size_gb: int, *, name: str | None = None, tenant: uuid.UUID = TENANT, cls: str = "standard"):
    vid = uuid.uuid4()
    return c.CreateVolume(volume_id=vid, tenant_id=tenant, user_id=USER, name=name or f"v-{vid.hex[:8]}",
                          storage_class=cls, size_bytes=size_gb * GB)


async def create(repo, backend, cmd) -> tuple[FakeUnitOfWork, c.VolumeDoc]:
    uow = FakeUnitOfWork("storage", "storage.create_volume", cmd)
    await handlers.create_volume(uow, cmd, policy=POLICY, backends={"standard": backend}, repository=factory(repo))
    return uow, c.VolumeChanged.model_validate(uow.only("storage.volume_changed").data).volume


def provision_cmd(size_gb: int, *volumes, alloc: uuid.UUID | None = None, tenant: uuid.UUID = TENANT):
    saga = uuid.uuid4()
    return c.ProvisionVolume(saga_id=saga, step="provision_volume", idempotency_key=step_key(saga, "provision_volume"),
                             allocation_id=alloc or uuid.uuid4(), tenant_id=tenant, size_gb=size_gb, ip_address=IP,
                             volumes=[c.VolumeRef(volume_id=v, mode=m) for v, m in volumes])


async def provision(repo, backend, cmd) -> dict:
    uow = FakeUnitOfWork("storage", "storage.provision_volume", cmd)
    return await handlers.provision_step(repo, cmd, ctx=uow, policy=POLICY, backends={"standard": backend})


async def test_a_create_locks_the_quota_before_summing_the_use_and_makes_the_volume_on_its_backend():
    repo, backend = FakeVolumeRepository(), VastBackend()
    _, doc = await create(repo, backend, create_cmd(10, name="data"))
    assert (doc.state, doc.version, doc.size_bytes, doc.backend, doc.name) == ("available", 1, 10 * GB, "vast", "data")
    assert repo.calls == ["claim", "lock_quota", "usage", "add"]
    assert list(backend.volumes) == [doc.volume_id] and len(backend.log.of("create")) == 3
    assert repo.volumes[doc.volume_id].export_source.startswith("vip.vast.example:/tessera/")


async def test_a_create_over_quota_or_refused_by_the_backend_is_rejected_and_leaves_nothing_there():
    repo, backend = FakeVolumeRepository(quotas={(TENANT, "standard"): Limits(max_bytes=15 * GB)}), VastBackend()
    await create(repo, backend, create_cmd(10))
    _, over = await create(repo, backend, create_cmd(6))
    assert over.state == "rejected"
    assert over.reason == f"quota storage:standard:bytes exceeded: limit {15 * GB} bytes, used {10 * GB} bytes, " \
                          f"requested {6 * GB} bytes"
    assert len(backend.volumes) == 1
    _, refused = await create(repo, RefusingBackend("create"), create_cmd(1))
    assert (refused.state, refused.reason) == ("rejected", "the appliance refused to create")


async def test_a_repeated_create_answers_the_volume_as_it_is_and_makes_nothing_twice():
    repo, backend = FakeVolumeRepository(), VastBackend()
    cmd = create_cmd(1)
    _, first = await create(repo, backend, cmd)
    _, again = await create(repo, backend, cmd)
    assert again == first and len(backend.log.of("create")) == 3


async def test_provision_makes_the_scratch_volume_attaches_the_named_ones_and_lets_the_slot_in():
    repo, backend = FakeVolumeRepository(), VastBackend()
    _, shared = await create(repo, backend, create_cmd(1, name="ref"))
    cmd = provision_cmd(2, (shared.volume_id, "ro"))
    reply = await provision(repo, backend, cmd)
    scratch = repo.volumes[reply["volume_id"]]
    assert (scratch.scratch, scratch.allocation_id, scratch.size_bytes, reply["size_gb"]) == (True, cmd.allocation_id,
                                                                                              2 * GB, 2)
    assert [(e["name"], e["mode"]) for e in reply["exports"]] == [(scratch.name, "rw"), ("ref", "ro")]
    assert backend.volumes[shared.volume_id].access == {IP: True} and backend.volumes[scratch.id].access == {IP: False}
    assert [a.state for a in repo.volumes[shared.volume_id].attachments] == ["attached"]
    assert await provision(repo, backend, provision_cmd(2, (shared.volume_id, "ro"), alloc=cmd.allocation_id)) == reply


async def test_a_refused_provision_undoes_what_it_did_on_the_backends():
    repo, backend = FakeVolumeRepository(), VastBackend()
    _, mine = await create(repo, backend, create_cmd(1))
    _, theirs = await create(repo, backend, create_cmd(1, tenant=uuid.uuid4()))
    ids = sorted([mine.volume_id, theirs.volume_id])     # attached in id order: make "mine" come first
    cmd = provision_cmd(2, (mine.volume_id, "rw"), (theirs.volume_id, "rw"))
    if ids[0] != mine.volume_id:
        cmd = provision_cmd(2, (theirs.volume_id, "rw"), (mine.volume_id, "rw"))
    with pytest.raises(StepRejected, match=f"volume {theirs.volume_id} not found"):
        await provision(repo, backend, cmd)
    assert set(backend.volumes) == {mine.volume_id, theirs.volume_id}        # the scratch volume is gone
    assert backend.volumes[mine.volume_id].access == {} and backend.log.of("revoke")


async def test_undo_detaches_every_volume_of_the_allocation_and_destroys_its_scratch_volume():
    repo, backend = FakeVolumeRepository(), VastBackend()
    _, named = await create(repo, backend, create_cmd(1))
    cmd = provision_cmd(1, (named.volume_id, "rw"))
    reply = await provision(repo, backend, cmd)
    undo = c.DeleteVolume(saga_id=cmd.saga_id, step="delete_volume", allocation_id=cmd.allocation_id,
                          idempotency_key=step_key(cmd.saga_id, "delete_volume"), tenant_id=TENANT)
    for _ in range(2):
        uow = FakeUnitOfWork("storage", "storage.delete_volume", undo)
        assert await handlers.delete_step(repo, undo, ctx=uow, backends={"standard": backend}) == {}
    assert repo.volumes[reply["volume_id"]].state == "deleted" and reply["volume_id"] not in map(str, backend.volumes)
    assert (repo.volumes[named.volume_id].state, repo.volumes[named.volume_id].attachments) == ("available", [])
    assert backend.volumes[named.volume_id].access == {}


async def test_a_backend_that_forgot_its_volumes_is_told_of_them_again():
    repo = FakeVolumeRepository()
    _, vol = await create(repo, VastBackend(), create_cmd(1))
    restarted, node = VastBackend(), uuid.uuid4()
    cmd = c.AttachVolume(volume_id=vol.volume_id, tenant_id=TENANT, allocation_id=uuid.uuid4(), node_id=node,
                         ip_address=IP)
    uow = FakeUnitOfWork("storage", "storage.attach_volume", cmd)
    await handlers.attach_volume(uow, cmd, backends={"standard": restarted}, repository=factory(repo))
    assert uow.types() == ["storage.volume_changed", "node_agent.mount_volume"]
    assert uow.emitted[1].data["export"]["source"].startswith("vip.vast.example:")
    assert restarted.volumes[vol.volume_id].access == {IP: False}


async def test_the_node_settles_an_attachment_a_late_mount_report_is_ignored_and_a_failed_unmount_keeps_it():
    repo, backend = FakeVolumeRepository(), VastBackend()
    _, vol = await create(repo, backend, create_cmd(1))
    alloc, node = uuid.uuid4(), uuid.uuid4()
    attach = c.AttachVolume(volume_id=vol.volume_id, tenant_id=TENANT, allocation_id=alloc, node_id=node)
    await handlers.attach_volume(FakeUnitOfWork("storage", "storage.attach_volume", attach), attach,
                                 backends={"standard": backend}, repository=factory(repo))

    async def report(mounted: bool, ok: bool = True, reason: str | None = None) -> c.VolumeDoc | None:
        evt = VolumeMountChanged(node_id=node, allocation_id=alloc, tenant_id=TENANT, volume_id=vol.volume_id,
                                 mounted=mounted, ok=ok, reason=reason)
        uow = FakeUnitOfWork("storage", "node_agent.volume_mount_changed", evt)
        await handlers.volume_mount_changed(uow, evt, backends={"standard": backend}, repository=factory(repo))
        return c.VolumeChanged.model_validate(uow.only("storage.volume_changed").data).volume if uow.emitted else None

    assert [(a.state, a.reason) for a in (await report(True)).attachments] == [("attached", None)]
    detach = c.DetachVolume(volume_id=vol.volume_id, tenant_id=TENANT, allocation_id=alloc)
    uow = FakeUnitOfWork("storage", "storage.detach_volume", detach)
    await handlers.detach_volume(uow, detach, backends={"standard": backend}, repository=factory(repo))
    assert uow.types() == ["storage.volume_changed", "node_agent.unmount_volume"]
    assert await report(True) is None                             # the mount's success, late: still detaching
    kept = await report(True, ok=False, reason="target is busy")
    assert (kept.state, kept.reason, [(a.state, a.reason) for a in kept.attachments]) == (
        "in-use", "target is busy", [("attached", "target is busy")])


async def test_a_users_share_publishes_the_limits_that_apply_to_the_user():
    repo = FakeVolumeRepository(quotas={(TENANT, "standard"): Limits(max_bytes=50 * GB)})
    cmd = c.SetStorageQuota(tenant_id=TENANT, storage_class="standard", user_id=USER, max_volumes=2, set_by=USER)
    uow = FakeUnitOfWork("storage", "storage.set_quota", cmd)
    await handlers.set_quota(uow, cmd, policy=POLICY, repository=factory(repo))
    changed = c.QuotaChanged.model_validate(uow.only("storage.quota_changed").data)
    assert (changed.effective_max_bytes, changed.effective_max_volumes, changed.version) == (50 * GB, 2, 1)
    assert repo.shares[(TENANT, "standard", USER)] == Limits(None, 2)
