"""Storage's own settings (TESSERA_STORAGE_DEFAULT_QUOTA_GB), read with the kit's settings helper."""
from __future__ import annotations

import pytest

from services.storage.domain.model import StoragePolicy
from services.storage.settings import StorageSettings
from shared.settings import SettingError, load


@pytest.mark.parametrize("environ", [{}, {"TESSERA_STORAGE_DEFAULT_QUOTA_GB": ""}])
def test_the_default_quota_is_100000_gb_when_the_variable_is_unset_or_empty(environ):
    assert load(StorageSettings, environ).policy == StoragePolicy(100_000)


def test_the_default_quota_is_read_from_its_variable_and_zero_is_allowed():
    assert load(StorageSettings, {"TESSERA_STORAGE_DEFAULT_QUOTA_GB": "10"}).policy == StoragePolicy(10)
    assert load(StorageSettings, {"TESSERA_STORAGE_DEFAULT_QUOTA_GB": "0"}).policy == StoragePolicy(0)


@pytest.mark.parametrize("value", ["lots", "-1", "1.5"])
def test_an_unusable_default_quota_is_refused_naming_the_variable_and_its_value(value):
    with pytest.raises(SettingError, match=f"TESSERA_STORAGE_DEFAULT_QUOTA_GB='{value}' is not an integer"):
        load(StorageSettings, {"TESSERA_STORAGE_DEFAULT_QUOTA_GB": value})
