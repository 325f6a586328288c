"""Volumes, attachments and storage classes (pure domain, no I/O): states, attach rules, grow-only resize."""
from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from services.storage.domain.model import Refused, StorageClass, StoragePolicy, Volume, scratch_id, scratch_name

T0 = datetime(2030, 1, 1, tzinfo=UTC)
TENANT = uuid.uuid4()
STANDARD = StorageClass("standard", "btrfs", max_volume_bytes=1000, default=True)


def volume(state: str = "available", *, shared: bool = False, size: int = 100) -> Volume:
    return Volume(uuid.uuid4(), TENANT, "data", "standard", "btrfs", size, state, T0, T0, shared=shared, version=1)


def test_a_volume_is_in_use_exactly_while_an_attachment_holds_it_and_every_change_grows_its_version():
    v, alloc = volume(), uuid.uuid4()
    v.attach(alloc, "rw", "attaching", node_id=None, client=None)
    v.touch(T0)
    assert (v.state, v.version) == ("in-use", 2)
    v.attachment(alloc).state = "failed"
    v.touch(T0, "mount failed")
    assert (v.state, v.version, v.reason) == ("available", 3, "mount failed")
    v.detach(alloc)
    v.touch(T0)
    assert (v.state, v.reason, v.attachments) == ("available", None, [])


def test_a_volume_that_is_not_shared_attaches_to_one_allocation_and_a_shared_one_to_many():
    single, shared, first, second = volume(), volume(shared=True), uuid.uuid4(), uuid.uuid4()
    for v in (single, shared):
        assert v.check_attach(TENANT, first) is None
        v.attach(first, "ro", "attached", node_id=None, client="10.0.0.1")
        v.touch(T0)
    assert single.check_attach(TENANT, first) is single.attachment(first)     # a repeat
    with pytest.raises(Refused, match=f"attached to allocation {first} and is not shared"):
        single.check_attach(TENANT, second)
    assert shared.check_attach(TENANT, second) is None


def test_a_failed_attachment_does_not_hold_a_volume_that_is_not_shared():
    v, first = volume(), uuid.uuid4()
    v.attach(first, "rw", "failed", node_id=None, client=None)
    v.touch(T0)
    assert v.check_attach(TENANT, uuid.uuid4()) is None


@pytest.mark.parametrize("state", ["deleted", "rejected"])
def test_another_tenants_or_a_dead_volume_is_not_found(state):
    with pytest.raises(Refused, match="not found"):
        volume().check_attach(uuid.uuid4(), uuid.uuid4())
    with pytest.raises(Refused, match="not found"):
        volume(state).check_attach(TENANT, uuid.uuid4())


def test_a_volume_in_error_cannot_be_attached():
    with pytest.raises(Refused, match="is error, not available"):
        volume("error").check_attach(TENANT, uuid.uuid4())


def test_a_volume_only_grows_up_to_its_class_maximum():
    v = volume(size=100)
    assert v.check_resize(200, STANDARD) and not v.check_resize(100, STANDARD)
    with pytest.raises(Refused, match="cannot shrink from 100 to 99 bytes"):
        v.check_resize(99, STANDARD)
    with pytest.raises(Refused, match="more than storage class 'standard' allows"):
        v.check_resize(1001, STANDARD)
    with pytest.raises(Refused, match="only an available or in-use volume can grow"):
        volume("error").check_resize(200, STANDARD)


def test_a_volume_cannot_be_destroyed_while_attached():
    v, alloc = volume(), uuid.uuid4()
    v.check_destroy()
    v.attach(alloc, "rw", "detaching", node_id=None, client=None)
    with pytest.raises(Refused, match=f"attached to 1 allocation.*{alloc}.*detach it first"):
        v.check_destroy()


def test_the_policy_finds_a_class_or_its_default_and_names_the_classes_on_offer():
    policy = StoragePolicy((STANDARD, StorageClass("fast", "vast")))
    assert policy.klass(None) is STANDARD and policy.klass("fast").backend == "vast"
    with pytest.raises(Refused, match="^unknown storage class 'gold'; offered: standard, fast$"):
        policy.klass("gold")
    with pytest.raises(ValueError, match="exactly one"):
        StoragePolicy((StorageClass("a", "btrfs"),))


def test_a_scratch_volume_has_a_stable_id_and_a_name_from_its_allocation():
    alloc = uuid.uuid4()
    assert scratch_id(alloc) == scratch_id(alloc) != scratch_id(uuid.uuid4())
    assert scratch_name(alloc) == f"scratch-{alloc.hex[:8]}" and scratch_name(alloc, True) == f"scratch-{alloc.hex}"
