"""Storage's own settings: the storage classes, the default quotas, the usage interval (read with the kit's
settings helper; nothing touches a file system or an appliance)."""
from __future__ import annotations

import json

import pytest

from services.storage.adapters.backends.btrfs import BtrfsBackend
from services.storage.adapters.backends.vast import VastBackend
from services.storage.domain.model import StorageClass, StoragePolicy
from services.storage.settings import StorageSettings
from shared.settings import SettingError, load


def classes(document: dict) -> dict[str, str]:
    return {"TESSERA_STORAGE_CLASSES": json.dumps(document)}


def test_the_defaults_are_one_btrfs_class_100000_gb_and_100_volumes_a_report_every_30_s():
    settings = load(StorageSettings, {})
    assert settings.policy == StoragePolicy((StorageClass("standard", "btrfs", default=True),), 100_000 * 10 ** 9, 100)
    assert settings.usage_interval_s == 30.0
    [backend] = settings.backends().values()
    assert isinstance(backend, BtrfsBackend) and str(backend.root) == "/var/lib/tessera/volumes"


def test_classes_name_their_backend_and_options_and_the_first_is_the_default_when_none_says_so():
    settings = load(StorageSettings, {"TESSERA_BTRFS_ROOT": "/srv/volumes", "TESSERA_STORAGE_DEFAULT_QUOTA_GB": "5",
                                      "TESSERA_STORAGE_DEFAULT_QUOTA_VOLUMES": "0", **classes({
                                          "local": {"backend": "btrfs", "description": "local disks"},
                                          "own": {"backend": "btrfs", "root": "/mnt/own"},
                                          "vast": {"backend": "vast", "nfs_host": "vip.example", "tenant_id": 3,
                                                   "max_volume_bytes": 1 << 40}})})
    policy = settings.policy
    assert [(c.name, c.backend, c.default, c.simulated) for c in policy.classes] == [
        ("local", "btrfs", True, False), ("own", "btrfs", False, False), ("vast", "vast", False, True)]
    assert (policy.klass("vast").max_volume_bytes, policy.default_quota_bytes, policy.default_quota_volumes) == \
        (1 << 40, 5 * 10 ** 9, 0)
    backends = settings.backends()
    assert (str(backends["local"].root), str(backends["own"].root)) == ("/srv/volumes", "/mnt/own")
    assert isinstance(backends["vast"], VastBackend) and backends["vast"].config.tenant_id == 3


@pytest.mark.parametrize("document, says", [
    ("{not json", "is not a JSON object of storage classes"),
    ("[]", "is not a JSON object of storage classes"),
    ('{"a": {"backend": "zfs"}}', "unknown backend 'zfs'"),
    ('{"a": {}}', "unknown backend 'None'"),
    ('{"a": {"backend": "btrfs", "default": true}, "b": {"backend": "vast", "default": true}}', "only one may be"),
    ('{"a": {"backend": "btrfs", "root": "relative"}}', "not an absolute path"),
    ('{"a": {"backend": "btrfs", "size": 1}}', "btrfs takes only the option 'root'"),
    ('{"a": {"backend": "vast", "vms": "x"}}', "vast has no option 'vms'"),
    ('{"a": {"backend": "weka", "url": "ftp:/x"}}', "WEKA URL"),
    ('{"a": {"backend": "lustre", "project_id_base": "1"}}', "must be an integer"),
    ('{"A": {"backend": "btrfs"}}', "class name 'A'"),
    ('{"a": {"backend": "btrfs", "max_volume_bytes": 1}}', "max_volume_bytes must be an integer"),
])
def test_unusable_classes_are_refused_naming_the_variable(document, says):
    with pytest.raises(SettingError, match="TESSERA_STORAGE_CLASSES=") as err:
        load(StorageSettings, {"TESSERA_STORAGE_CLASSES": document})
    assert says in str(err.value)


@pytest.mark.parametrize("var, value", [("TESSERA_STORAGE_DEFAULT_QUOTA_GB", "-1"),
                                        ("TESSERA_STORAGE_DEFAULT_QUOTA_VOLUMES", "many"),
                                        ("TESSERA_STORAGE_USAGE_INTERVAL_S", "0.1"),
                                        ("TESSERA_BTRFS_ROOT", "volumes")])
def test_an_unusable_value_is_refused_naming_its_variable(var, value):
    with pytest.raises(SettingError, match=f"{var}='{value}' is not"):
        load(StorageSettings, {var: value})
