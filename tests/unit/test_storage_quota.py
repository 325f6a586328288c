"""Storage quotas (pure domain, no I/O): bytes and volumes per (tenant, class), a user's share, what applies."""
from __future__ import annotations

import pytest

from services.storage.domain.quota import Limits, Quota, QuotaExceeded, Usage, effective

DEFAULTS = Limits(1000, 10)


def test_a_tenant_without_its_own_limits_gets_the_defaults_and_its_own_win_even_when_zero():
    assert (Quota.of("standard", Limits(), DEFAULTS).max_bytes, Quota.of("standard", Limits(), DEFAULTS).max_volumes) \
        == (1000, 10)
    own = Quota.of("standard", Limits(max_bytes=0, max_volumes=None), DEFAULTS)
    assert (own.max_bytes, own.max_volumes) == (0, 10)


def test_filling_a_quota_exactly_is_allowed():
    Quota("standard", 100, 3).check(Usage(60, 2), 40, 1)


def test_a_byte_breach_names_the_quota_its_limit_the_use_and_the_request():
    with pytest.raises(QuotaExceeded) as err:
        Quota("fast", 100, 3).check(Usage(60, 1), 41, 1)
    assert str(err.value) == "quota storage:fast:bytes exceeded: limit 100 bytes, used 60 bytes, requested 41 bytes"
    assert (err.value.quota, err.value.limit, err.value.used, err.value.requested) == ("storage:fast:bytes", 100, 60, 41)


def test_a_count_breach_names_the_volumes_quota():
    with pytest.raises(QuotaExceeded, match=r"^quota storage:standard:volumes exceeded: limit 2 volumes, "
                                            r"used 2 volumes, requested 1 volume$"):
        Quota("standard", 100, 2).check(Usage(10, 2), 1, 1)


def test_a_resize_asks_for_no_volume_so_a_full_count_does_not_refuse_it():
    Quota("standard", 100, 2).check(Usage(10, 2), 50, 0)


def test_a_users_share_limits_the_user_on_top_of_the_tenant():
    quota = Quota.of("standard", Limits(), DEFAULTS, user=Limits(max_bytes=50))
    quota.check(Usage(500, 5), 20, 1, Usage(30, 1))
    with pytest.raises(QuotaExceeded, match="^quota storage:standard:user:bytes exceeded: limit 50 bytes, used 30"):
        quota.check(Usage(500, 5), 21, 1, Usage(30, 1))
    with pytest.raises(QuotaExceeded, match="storage:standard:bytes"):     # the tenant's limit is checked first
        quota.check(Usage(990, 5), 21, 1, Usage(30, 1))
    with pytest.raises(QuotaExceeded, match="storage:standard:user:volumes"):
        Quota.of("standard", Limits(), DEFAULTS, user=Limits(max_volumes=1)).check(Usage(0, 0), 1, 1, Usage(1, 1))


def test_the_effective_limits_are_the_own_ones_where_set_else_the_fallbacks():
    assert effective(Limits(5, None), DEFAULTS) == (5, 10)
    assert effective(Limits(), Limits(*effective(Limits(None, 3), DEFAULTS))) == (1000, 3)
