"""Capacity shape validation and quota rules (pure domain, no I/O)."""
from __future__ import annotations

import uuid

import pytest

from services.scheduler.domain.quota import QuotaBook, QuotaError, QuotaKey
from services.scheduler.domain.shapes import MIG_PROFILES, STANDARD_SHAPES, Shape, ShapeError, mig_fits_gpu


@pytest.mark.parametrize("count", [1, 2, 4, 8])
def test_vm_slices_of_1_2_4_8_gpus_are_valid(count):
    assert Shape(f"vm.{count}", "vm", count).quota_units == count


@pytest.mark.parametrize("kwargs, message", [
    ({"name": "vm.3", "kind": "vm", "gpu_count": 3}, "1, 2, 4 or 8"),
    ({"name": "vm.16", "kind": "vm", "gpu_count": 16}, "1, 2, 4 or 8"),
    ({"name": "x", "kind": "container", "gpu_count": 1}, "kind must be one of"),
    ({"name": "", "kind": "vm", "gpu_count": 1}, "non-empty"),
    ({"name": "vm.t", "kind": "vm", "gpu_count": True}, "integer"),
    ({"name": "bm.0", "kind": "bare_metal", "gpu_count": 0}, "node's GPU count"),
    ({"name": "mig.2", "kind": "mig", "gpu_count": 2, "mig_profile": "1g.10gb"}, "gpu_count 1"),
    ({"name": "mig.x", "kind": "mig", "gpu_count": 1, "mig_profile": "9g.1tb"}, "unknown mig_profile"),
    ({"name": "mig.none", "kind": "mig", "gpu_count": 1}, "unknown mig_profile"),
    ({"name": "vm.m", "kind": "vm", "gpu_count": 1, "mig_profile": "1g.10gb"}, "only mig shapes"),
])
def test_invalid_shapes_are_refused_with_the_rule_they_break(kwargs, message):
    with pytest.raises(ShapeError, match=message):
        Shape(**kwargs)


def test_mig_shapes_know_their_per_gpu_capacity_and_count_as_one_gpu_of_quota():
    small, big = STANDARD_SHAPES["mig.1g.10gb"], STANDARD_SHAPES["mig.3g.40gb"]
    assert (small.mig_per_gpu, big.mig_per_gpu) == (7, 2)
    assert small.quota_units == big.quota_units == 1
    assert mig_fits_gpu("1g.10gb", 80) and not mig_fits_gpu("1g.10gb", 40)
    assert all(p.per_gpu <= 7 for p in MIG_PROFILES.values())


def key(tenant=None, model="H100", pool="shared") -> QuotaKey:
    return QuotaKey(tenant or uuid.uuid4(), model, pool)


def test_quota_allows_exactly_up_to_the_limit_and_not_one_gpu_more():
    book, k = QuotaBook(), key()
    book.set_limit(k, 8)
    book.charge(k, 6)
    assert book.check(k, 2).ok
    v = book.check(k, 3)
    assert not v.ok and (v.limit, v.used, v.requested) == (8, 6, 3)
    assert v.quota == f"tenant/{k.tenant_id}/H100/shared" and "limit 8, in use 6, requested 3" in v.reason


def test_a_tenant_without_a_quota_row_may_not_allocate_there():
    book, k = QuotaBook(), key()
    book.set_limit(key(k.tenant_id, pool="spot"), 100)
    v = book.check(k, 1)
    assert not v.ok and v.limit is None and "no quota" in v.reason


def test_lowering_a_quota_below_use_blocks_new_allocations_and_keeps_the_use():
    book, k = QuotaBook(), key()
    book.set_limit(k, 16)
    book.charge(k, 12)
    book.set_limit(k, 8)
    assert book.used(k) == 12 and not book.check(k, 1).ok
    book.refund(k, 5)
    assert book.check(k, 1).ok


def test_refunds_never_drive_use_below_zero_and_bad_limits_are_refused():
    book, k = QuotaBook(), key()
    book.refund(k, 3)
    assert book.used(k) == 0
    with pytest.raises(QuotaError, match="non-negative"):
        book.set_limit(k, -1)
    with pytest.raises(QuotaError, match="guaranteed"):
        book.set_limit(k, 4, guaranteed=-2)
    assert book.limit(k) is None


def test_a_quota_use_message_holds_one_to_its_contracts_number_of_quotas():
    from pydantic import ValidationError

    from services.scheduler import contracts as sc
    doc = {"tenant_id": uuid.uuid4(), "gpu_model": "H100", "pool": "shared", "limit": 1, "used": 0, "version": 1}
    assert len(sc.QuotaUseChanged(quotas=[doc] * sc.QUOTA_USE_PER_MESSAGE).quotas) == sc.QUOTA_USE_PER_MESSAGE
    for quotas in ([], [doc] * (sc.QUOTA_USE_PER_MESSAGE + 1)):
        with pytest.raises(ValidationError):
            sc.QuotaUseChanged(quotas=quotas)
