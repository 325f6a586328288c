"""Storage's step handlers over an in-memory repository (no I/O): quotas, idempotent provisioning, deletion."""
from __future__ import annotations

import uuid
from datetime import datetime, timezone

import pytest

from services.storage import contracts as c
from services.storage import handlers
from services.storage.domain.model import StoragePolicy, Volume
from shared.participant import StepRejected
from shared.wire import step_key
from tests.support.fakes import FakeVolumeRepository

T0 = datetime(2030, 1, 1, tzinfo=timezone.utc)
TENANT = uuid.uuid4()
POLICY = StoragePolicy(default_quota_gb=1000)


def provision_cmd(size_gb: int, *, alloc: uuid.UUID | None = None, tenant: uuid.UUID = TENANT) -> c.ProvisionVolume:
    saga = uuid.uuid4()
    return c.ProvisionVolume(saga_id=saga, step="provision_volume", idempotency_key=step_key(saga, "provision_volume"),
                             allocation_id=alloc or uuid.uuid4(), tenant_id=tenant, size_gb=size_gb)


def delete_cmd(alloc: uuid.UUID) -> c.DeleteVolume:
    saga = uuid.uuid4()
    return c.DeleteVolume(saga_id=saga, step="delete_volume", idempotency_key=step_key(saga, "delete_volume"),
                          allocation_id=alloc, tenant_id=TENANT)


def volume(size_gb: int, *, tenant: uuid.UUID = TENANT) -> Volume:
    return Volume(uuid.uuid4(), uuid.uuid4(), tenant, size_gb, T0)


async def provision(repo: FakeVolumeRepository, cmd: c.ProvisionVolume, policy: StoragePolicy = POLICY) -> dict:
    return await handlers.provision_step(repo, cmd, policy=policy)


async def test_a_volume_that_fills_the_tenants_quota_exactly_is_provisioned():
    repo = FakeVolumeRepository(volume(60), quotas={TENANT: 100})
    cmd = provision_cmd(40)
    reply = await provision(repo, cmd)
    stored = repo.volumes[cmd.allocation_id]
    assert (reply["volume_id"], reply["size_gb"]) == (stored.id, 40)
    assert (stored.tenant_id, stored.size_gb) == (TENANT, 40)
    c.VolumeProvisioned(saga_id=cmd.saga_id, step=cmd.step, idempotency_key=cmd.idempotency_key,
                        allocation_id=cmd.allocation_id, **reply)


async def test_a_volume_one_gb_over_the_quota_is_refused_naming_limit_request_and_use_and_creates_nothing():
    repo = FakeVolumeRepository(volume(60), quotas={TENANT: 100})
    cmd = provision_cmd(41)
    with pytest.raises(StepRejected) as refused:
        await provision(repo, cmd)
    reason = refused.value.reason
    assert "quota exceeded" in reason and "41 GB requested" in reason
    assert "limit 100 GB" in reason and "current use 60 GB" in reason
    assert cmd.allocation_id not in repo.volumes and len(repo.volumes) == 1


async def test_the_default_quota_applies_exactly_to_a_tenant_without_its_own_limit():
    repo = FakeVolumeRepository()
    assert (await provision(repo, provision_cmd(1000)))["size_gb"] == 1000
    with pytest.raises(StepRejected, match="limit 1000 GB, current use 1000 GB"):
        await provision(repo, provision_cmd(1))


async def test_a_tenant_limit_of_zero_overrides_the_default_and_refuses_any_volume():
    repo = FakeVolumeRepository(quotas={TENANT: 0})
    with pytest.raises(StepRejected, match="limit 0 GB"):
        await provision(repo, provision_cmd(1))
    assert repo.volumes == {}


async def test_other_tenants_volumes_do_not_count_against_a_tenants_quota():
    repo = FakeVolumeRepository(volume(500, tenant=uuid.uuid4()), quotas={TENANT: 100})
    assert (await provision(repo, provision_cmd(100)))["size_gb"] == 100


async def test_the_tenants_quota_is_locked_before_its_use_is_read_and_the_volume_added():
    repo = FakeVolumeRepository()
    await provision(repo, provision_cmd(10))
    assert repo.calls == ["volume_for", "lock_quota", "used_gb", "add"]


async def test_provisioning_again_for_the_same_allocation_returns_the_same_volume_and_creates_no_second():
    repo = FakeVolumeRepository(quotas={TENANT: 100})
    alloc = uuid.uuid4()
    first = await provision(repo, provision_cmd(100, alloc=alloc))
    again = await provision(repo, provision_cmd(100, alloc=alloc))   # another key, the quota full by now
    assert again == first
    assert list(repo.volumes) == [alloc]


async def test_a_zero_size_request_provisions_no_volume_and_leaves_the_quota_alone():
    repo = FakeVolumeRepository(quotas={TENANT: 0})
    cmd = provision_cmd(0)
    reply = await provision(repo, cmd)
    assert reply == {"volume_id": None, "size_gb": 0}
    assert repo.volumes == {} and repo.calls == []
    c.VolumeProvisioned(saga_id=cmd.saga_id, step=cmd.step, idempotency_key=cmd.idempotency_key,
                        allocation_id=cmd.allocation_id, **reply)


async def test_delete_removes_the_allocations_volume_and_frees_its_quota():
    v = volume(100)
    repo = FakeVolumeRepository(v, quotas={TENANT: 100})
    assert await handlers.delete_step(repo, delete_cmd(v.allocation_id)) == {}
    assert repo.volumes == {}
    assert (await provision(repo, provision_cmd(100)))["size_gb"] == 100


async def test_delete_is_idempotent_and_safe_when_the_allocation_never_had_a_volume():
    v, other = volume(10), volume(20)
    repo = FakeVolumeRepository(v, other)
    for _ in range(2):
        assert await handlers.delete_step(repo, delete_cmd(v.allocation_id)) == {}
    assert await handlers.delete_step(repo, delete_cmd(uuid.uuid4())) == {}
    assert list(repo.volumes.values()) == [other]
