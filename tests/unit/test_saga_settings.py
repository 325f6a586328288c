"""The coordinator's TESSERA_SAGA_* settings and its policy arithmetic."""
from __future__ import annotations

from datetime import timedelta

import pytest

from services.saga.domain.model import Policy
from services.saga.settings import SagaSettings


def test_defaults_apply_when_nothing_is_set():
    s = SagaSettings.from_env({})
    assert s.policy == Policy(30.0, 10.0, 5, 8, (0.5, 1.0, 2.0, 4.0, 8.0))
    assert s.deadline_poll_s == 0.2


def test_every_setting_is_read_from_its_variable():
    s = SagaSettings.from_env({
        "TESSERA_SAGA_STEP_TIMEOUT_S": "2.5", "TESSERA_SAGA_COMPENSATION_TIMEOUT_S": "1",
        "TESSERA_SAGA_COMPENSATION_ATTEMPTS": "2", "TESSERA_SAGA_RELEASE_ATTEMPTS": "3",
        "TESSERA_SAGA_BACKOFF_S": "0.1,0.2", "TESSERA_SAGA_DEADLINE_POLL_S": "0.05"})
    assert s.policy == Policy(2.5, 1.0, 2, 3, (0.1, 0.2)) and s.deadline_poll_s == 0.05


@pytest.mark.parametrize("name,value", [
    ("TESSERA_SAGA_STEP_TIMEOUT_S", "soon"), ("TESSERA_SAGA_STEP_TIMEOUT_S", "0"),
    ("TESSERA_SAGA_COMPENSATION_ATTEMPTS", "0"), ("TESSERA_SAGA_BACKOFF_S", "1,,2"),
    ("TESSERA_SAGA_BACKOFF_S", "-1"), ("TESSERA_SAGA_DEADLINE_POLL_S", "0"),
])
def test_an_unusable_value_is_refused_with_a_clear_error(name, value):
    with pytest.raises(ValueError, match=f"saga settings: {name}="):
        SagaSettings.from_env({name: value})


def test_backoff_grows_per_attempt_and_then_repeats_its_last_delay():
    p = Policy(backoff_s=(0.5, 1, 2))
    assert [p.backoff(n) for n in (1, 2, 3, 4, 9)] == [timedelta(seconds=x) for x in (0.5, 1, 2, 2, 2)]


def test_a_step_may_have_its_own_timeout_and_provision_node_has_a_long_one_by_default():
    from services.saga.settings import SagaSettings
    default = SagaSettings.from_env({}).policy
    assert default.step_timeout_of("provision_node") == 600 and default.step_timeout_of("attach_network") == 30
    tuned = SagaSettings.from_env({"TESSERA_SAGA_STEP_TIMEOUTS": "attach_network=7, provision_node=90",
                                   "TESSERA_SAGA_STEP_TIMEOUT_S": "4"}).policy
    assert (tuned.step_timeout_of("attach_network"), tuned.step_timeout_of("provision_node"),
            tuned.step_timeout_of("reserve_slots")) == (7, 90, 4)


def test_a_timeout_for_a_step_no_saga_has_is_refused_naming_the_variable():
    import pytest

    from services.saga.settings import SagaSettings
    from shared.settings import SettingError
    with pytest.raises(SettingError, match="TESSERA_SAGA_STEP_TIMEOUTS"):
        SagaSettings.from_env({"TESSERA_SAGA_STEP_TIMEOUTS": "boot_rocket=5"})
