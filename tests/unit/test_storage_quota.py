"""Tenant quotas (pure domain, no I/O)."""
from __future__ import annotations

import uuid

import pytest

from services.storage.domain.model import Quota, QuotaExceeded, StoragePolicy

TENANT = uuid.uuid4()


def test_the_default_quota_is_100000_gb():
    assert StoragePolicy().default_quota_gb == 100_000


def test_a_tenant_without_its_own_limit_gets_the_default():
    assert Quota.of(TENANT, None, StoragePolicy(500)).limit_gb == 500


def test_a_tenant_limit_overrides_the_default_even_when_it_is_zero():
    assert Quota.of(TENANT, 0, StoragePolicy(500)).limit_gb == 0


def test_filling_the_quota_exactly_is_allowed():
    Quota(TENANT, 100).check(used_gb=60, requested_gb=40)


def test_exceeding_the_quota_names_quota_limit_request_and_current_use():
    with pytest.raises(QuotaExceeded) as err:
        Quota(TENANT, 100).check(used_gb=60, requested_gb=41)
    message = str(err.value)
    assert "quota exceeded" in message and str(TENANT) in message
    assert "41 GB requested" in message and "limit 100 GB" in message and "current use 60 GB" in message


def test_a_negative_default_quota_is_refused():
    with pytest.raises(ValueError):
        StoragePolicy(-1)
