"""The exact calls the lustre, vast and weka storage drivers render and record (pure, no I/O)."""
from __future__ import annotations

import uuid

import pytest

from services.storage.adapters.backends.appliances import CallLog
from services.storage.adapters.backends.base import BackendCall, BackendError, Export, Usage, VolumeSpec
from services.storage.adapters.backends.lustre import LustreBackend, LustreConfig
from services.storage.adapters.backends.vast import VastBackend
from services.storage.adapters.backends.weka import WekaBackend

GiB = 1 << 30
TENANT = uuid.UUID("1e2d3c4b-0000-4000-8000-000000000001")
VOLUME = uuid.UUID("5a6b7c8d-0000-4000-8000-000000000002")
SPEC = VolumeSpec(VOLUME, TENANT, "data", 100 * GiB)
NAME = "t-1e2d3c4b-v-5a6b7c8d"
PID = 445416322                                   # 1_000_000 + VOLUME.int % (2**31 - 1_000_000)
A, B, C = "10.20.0.5", "10.20.0.6", "10.20.0.7"
DRIVERS = [LustreBackend, VastBackend, WekaBackend]


def x(command: str) -> BackendCall:
    return BackendCall("exec", command)


def rw_ro(command: str) -> list[BackendCall]:
    return [x(command.format(m=m)) for m in ("rw", "ro")]


# -- lustre ---------------------------------------------------------------------------------------------------------
LDIR = f"/lustre/fs0/tessera/{NAME}"


def test_lustre_create_renders_the_directory_its_project_quota_and_a_nodemap_per_mode():
    nm = f"p{PID}"
    assert LustreBackend().create_calls(SPEC) == [
        x(f"mkdir -p {LDIR}"), x(f"chown 65534:65534 {LDIR}"), x(f"lfs project -p {PID} -s {LDIR}"),
        x(f"lfs setquota -p {PID} -B 104857600 /lustre/fs0"),
        x(f"lctl nodemap_add {nm}_rw"),
        x(f"lctl nodemap_modify --name {nm}_rw --property admin --value 0"),
        x(f"lctl nodemap_modify --name {nm}_rw --property trusted --value 0"),
        x(f"lctl nodemap_modify --name {nm}_rw --property squash_projid --value {PID}"),
        x(f"lctl nodemap_set_fileset --name {nm}_rw --fileset /tessera/{NAME}"),
        x(f"lctl nodemap_add {nm}_ro"),
        x(f"lctl nodemap_modify --name {nm}_ro --property admin --value 0"),
        x(f"lctl nodemap_modify --name {nm}_ro --property trusted --value 0"),
        x(f"lctl nodemap_modify --name {nm}_ro --property squash_projid --value {PID}"),
        x(f"lctl nodemap_modify --name {nm}_ro --property readonly_mount --value 1"),
        x(f"lctl nodemap_set_fileset --name {nm}_ro --fileset /tessera/{NAME}"),
    ]
    assert LustreBackend().export(SPEC) == Export(VOLUME, "lustre", "10.0.0.2@o2ib:/fs0",
                                                  {"fstype": "lustre", "flock": ""})


def test_lustre_resize_raises_the_project_limit_in_kib_and_refuses_a_shrink():
    assert LustreBackend().resize_calls(SPEC, 200 * GiB + 1) == [
        x(f"lfs setquota -p {PID} -B 209715201 /lustre/fs0")]
    assert LustreBackend().resize_calls(SPEC, 100 * GiB) == []
    with pytest.raises(BackendError, match="cannot shrink"):
        LustreBackend().resize_calls(SPEC, 50 * GiB)


def test_lustre_allow_puts_one_nid_range_per_client_into_the_nodemap_of_its_mode():
    lustre = LustreBackend()
    assert lustre.allow_calls(SPEC, (A, B, A), False) == [
        x(f"lctl nodemap_add_range --name p{PID}_rw --range {A}@o2ib"),
        x(f"lctl nodemap_add_range --name p{PID}_rw --range {B}@o2ib")]
    assert lustre.allow_calls(SPEC, (C,), True) == [x(f"lctl nodemap_add_range --name p{PID}_ro --range {C}@o2ib")]
    assert lustre.allow_calls(SPEC, (A, C), True, {A: False, C: True}) == [
        x(f"lctl nodemap_del_range --name p{PID}_rw --range {A}@o2ib"),
        x(f"lctl nodemap_add_range --name p{PID}_ro --range {A}@o2ib")]
    assert lustre.revoke_calls(SPEC, (A, B, C), {A: False, C: True}) == [
        x(f"lctl nodemap_del_range --name p{PID}_rw --range {A}@o2ib"),
        x(f"lctl nodemap_del_range --name p{PID}_ro --range {C}@o2ib")]


async def test_lustre_delete_takes_the_clients_out_then_the_nodemaps_the_data_and_the_limit():
    lustre = LustreBackend(LustreConfig(mount="/mnt/exa", mgs_nid="10.1.0.2@tcp", fsname="exa", subdir="t"))
    await lustre.create(SPEC)
    await lustre.allow(VOLUME, (A,), read_only=False)
    await lustre.delete(VOLUME)
    assert lustre.log.of("allow") == [x(f"lctl nodemap_add_range --name p{PID}_rw --range {A}@tcp")]
    assert lustre.log.of("delete") == [
        x(f"lctl nodemap_del_range --name p{PID}_rw --range {A}@tcp"),
        *rw_ro(f"lctl nodemap_del p{PID}_{{m}}"),
        x(f"rm -rf /mnt/exa/t/{NAME}"), x(f"lfs setquota -p {PID} -B 0 /mnt/exa")]


async def test_lustre_refuses_a_second_volume_on_the_same_project_id_and_a_client_in_two_volumes():
    lustre = LustreBackend()
    await lustre.create(SPEC)
    span = 2**31 - 1_000_000
    twin = uuid.UUID(int=VOLUME.int + (1 << 120) - (1 << 120) % span)        # same project id, another name
    assert lustre.project_id(twin) == PID
    with pytest.raises(BackendError, match=f"project id {PID}"):
        await lustre.create(VolumeSpec(twin, TENANT, "twin", GiB))
    other = VolumeSpec(uuid.UUID("6b7c8d9e-0000-4000-8000-000000000003"), TENANT, "other", GiB)
    await lustre.create(other)
    await lustre.allow(VOLUME, (A,), read_only=False)
    with pytest.raises(BackendError, match="one nodemap"):
        await lustre.allow(other.volume_id, (B, A), read_only=True)
    assert lustre.log.of("allow") == [x(f"lctl nodemap_add_range --name p{PID}_rw --range {A}@o2ib")]


# -- vast -----------------------------------------------------------------------------------------------------------
VMS = "https://vms.example/api"
POLICY = f"{VMS}/viewpolicies/{{name=vp-{NAME}}}/"


def hosts(rw: list[str], ro: list[str], no_squash: list[str]) -> dict:
    return {"nfs_read_write": rw, "nfs_read_only": ro, "nfs_no_squash": no_squash}


def test_vast_create_renders_a_view_policy_a_view_and_a_quota():
    assert VastBackend().create_calls(SPEC) == [
        BackendCall("POST", f"{VMS}/viewpolicies/", {"name": f"vp-{NAME}", "tenant_id": 1, "flavor": "NFS",
                                                     "auth_source": "RPC", **hosts([], [], [])}),
        BackendCall("POST", f"{VMS}/views/", {"name": NAME, "path": f"/tessera/{NAME}", "create_dir": True,
                                              "protocols": ["NFS"], "tenant_id": 1,
                                              "policy_id": f"{{viewpolicies/name=vp-{NAME}}}"}),
        BackendCall("POST", f"{VMS}/quotas/", {"name": NAME, "path": f"/tessera/{NAME}", "tenant_id": 1,
                                               "hard_limit": 107374182400}),
    ]
    assert VastBackend().export(SPEC) == Export(VOLUME, "vast", f"vip.vast.example:/tessera/{NAME}",
                                                {"fstype": "nfs", "vers": "3", "proto": "tcp", "hard": ""})


def test_vast_resize_patches_the_quota_and_refuses_a_shrink():
    assert VastBackend().resize_calls(SPEC, 200 * GiB) == [
        BackendCall("PATCH", f"{VMS}/quotas/{{name={NAME}}}/", {"hard_limit": 214748364800})]
    with pytest.raises(BackendError, match="cannot shrink"):
        VastBackend().resize_calls(SPEC, GiB)


def test_vast_allow_and_revoke_patch_the_policy_with_exactly_its_hosts():
    vast = VastBackend()
    assert vast.allow_calls(SPEC, (B, A), False) == [BackendCall("PATCH", POLICY, hosts([A, B], [], [A, B]))]
    assert vast.allow_calls(SPEC, (C,), True, {A: False, B: False}) == [
        BackendCall("PATCH", POLICY, hosts([A, B], [C], [A, B, C]))]
    assert vast.allow_calls(SPEC, (A,), False, {A: False}) == []
    assert vast.revoke_calls(SPEC, (A, "10.9.9.9"), {A: False, C: True}) == [
        BackendCall("PATCH", POLICY, hosts([], [C], [C]))]
    assert vast.revoke_calls(SPEC, ("10.9.9.9",), {A: False}) == []


async def test_vast_delete_closes_the_policy_then_removes_the_view_quota_directory_and_policy():
    vast = VastBackend()
    await vast.create(SPEC)
    await vast.allow(VOLUME, (A,), read_only=True)
    await vast.delete(VOLUME)
    assert vast.log.of("delete") == [
        BackendCall("PATCH", POLICY, hosts([], [], [])),
        BackendCall("DELETE", f"{VMS}/views/{{name={NAME}}}/"),
        BackendCall("DELETE", f"{VMS}/quotas/{{name={NAME}}}/"),
        BackendCall("DELETE", f"{VMS}/folders/delete_folder/", {"path": f"/tessera/{NAME}", "tenant_id": 1}),
        BackendCall("DELETE", POLICY),
    ]


# -- weka -----------------------------------------------------------------------------------------------------------
WEKA = "https://weka.example:14000/api/v2"
GROUPS = f"{WEKA}/nfs/clientGroups"


def permission(mode: str) -> dict:
    return {"filesystem": NAME, "group": f"{NAME}-{mode.lower()}", "path": "/", "permission_type": mode,
            "squash_mode": "none", "anon_uid": 65534, "anon_gid": 65534, "supported_versions": ["V3", "V4"]}


def test_weka_create_renders_a_filesystem_two_client_groups_and_their_permissions():
    assert WekaBackend().create_calls(SPEC) == [
        BackendCall("POST", f"{WEKA}/fileSystems", {"name": NAME, "group_name": "default",
                                                    "total_capacity": 107374182400}),
        BackendCall("POST", GROUPS, {"name": f"{NAME}-rw"}),
        BackendCall("POST", GROUPS, {"name": f"{NAME}-ro"}),
        BackendCall("POST", f"{WEKA}/nfs/permissions", permission("RW")),
        BackendCall("POST", f"{WEKA}/nfs/permissions", permission("RO")),
    ]
    assert WekaBackend().export(SPEC) == Export(VOLUME, "weka", f"nfs.weka.example:/{NAME}",
                                                {"fstype": "nfs", "vers": "3", "proto": "tcp", "hard": ""})


def test_weka_resize_puts_the_filesystem_capacity_and_refuses_a_shrink():
    assert WekaBackend().resize_calls(SPEC, 200 * GiB) == [
        BackendCall("PUT", f"{WEKA}/fileSystems/{{name={NAME}}}", {"total_capacity": 214748364800})]
    with pytest.raises(BackendError, match="cannot shrink"):
        WekaBackend().resize_calls(SPEC, 100 * GiB - 1)


def test_weka_allow_adds_one_host_rule_per_client_to_the_group_of_its_mode():
    weka, rw, ro = WekaBackend(), f"{GROUPS}/{{name={NAME}-rw}}/rules", f"{GROUPS}/{{name={NAME}-ro}}/rules"
    assert weka.allow_calls(SPEC, (A, B), False) == [
        BackendCall("POST", rw, {"ip": f"{A}/255.255.255.255"}), BackendCall("POST", rw, {"ip": f"{B}/255.255.255.255"})]
    assert weka.allow_calls(SPEC, (A, C), True, {A: False, C: True}) == [
        BackendCall("DELETE", f"{rw}/{{rule={A}/255.255.255.255}}"),
        BackendCall("POST", ro, {"ip": f"{A}/255.255.255.255"})]
    assert weka.revoke_calls(SPEC, (C, B), {A: False, C: True}) == [
        BackendCall("DELETE", f"{ro}/{{rule={C}/255.255.255.255}}")]


async def test_weka_delete_removes_rules_permissions_groups_and_the_filesystem():
    weka = WekaBackend()
    await weka.create(SPEC)
    await weka.allow(VOLUME, (A,), read_only=False)
    await weka.delete(VOLUME)
    assert weka.log.of("delete") == [
        BackendCall("DELETE", f"{GROUPS}/{{name={NAME}-rw}}/rules/{{rule={A}/255.255.255.255}}"),
        BackendCall("DELETE", f"{WEKA}/nfs/permissions/{{group={NAME}-rw}}"),
        BackendCall("DELETE", f"{WEKA}/nfs/permissions/{{group={NAME}-ro}}"),
        BackendCall("DELETE", f"{GROUPS}/{{name={NAME}-rw}}"),
        BackendCall("DELETE", f"{GROUPS}/{{name={NAME}-ro}}"),
        BackendCall("DELETE", f"{WEKA}/fileSystems/{{name={NAME}}}"),
    ]


# -- every driver ---------------------------------------------------------------------------------------------------
async def scenario(driver) -> list:
    await driver.create(SPEC)
    await driver.allow(VOLUME, (A, B), read_only=False)
    await driver.allow(VOLUME, (C,), read_only=True)
    await driver.resize(VOLUME, 150 * GiB)
    await driver.revoke(VOLUME, (B,))
    await driver.usage(VOLUME)
    await driver.delete(VOLUME)
    return driver.log.calls


@pytest.mark.parametrize("driver", DRIVERS)
async def test_each_action_sends_exactly_what_its_renderer_renders(driver):
    log, r = CallLog(), driver()
    grown = VolumeSpec(VOLUME, TENANT, "data", 150 * GiB)
    expected = {"create": r.create_calls(SPEC),
                "allow": r.allow_calls(SPEC, (A, B), False) + r.allow_calls(SPEC, (C,), True, {A: False, B: False}),
                "resize": r.resize_calls(SPEC, 150 * GiB),
                "revoke": r.revoke_calls(grown, (B,), {A: False, B: False, C: True}),
                "usage": r.usage_calls(grown),
                "delete": r.revoke_calls(grown, (A, C), {A: False, C: True}) + r.delete_calls(grown)}
    calls = await scenario(driver(log=log))
    assert calls is log.calls
    assert [act for act, _ in calls] == [act for act, sent in expected.items() for _ in sent]
    assert {act: log.of(act) for act in expected} == expected


@pytest.mark.parametrize("driver", DRIVERS)
async def test_the_same_commands_render_the_same_calls(driver):
    assert await scenario(driver()) == await scenario(driver())


@pytest.mark.parametrize("driver", DRIVERS)
async def test_a_second_create_sends_nothing_and_returns_the_same_export(driver):
    backend = driver()
    first = await backend.create(SPEC)
    sent = list(backend.log.calls)
    assert await backend.create(SPEC) == first
    assert backend.log.calls == sent


@pytest.mark.parametrize("driver", DRIVERS)
async def test_unknown_volumes_and_clients_are_nothing_to_delete_or_revoke(driver):
    backend = driver()
    await backend.delete(VOLUME)
    await backend.revoke(VOLUME, (A,))
    await backend.create(SPEC)
    await backend.revoke(VOLUME, (A,))
    await backend.delete(VOLUME)
    await backend.delete(VOLUME)
    assert {act for act, _ in backend.log.calls} == {"create", "delete"}
    with pytest.raises(BackendError, match="no volume"):
        await backend.allow(VOLUME, (A,), read_only=False)


@pytest.mark.parametrize("driver", DRIVERS)
async def test_a_shrink_is_refused_and_the_same_size_changes_nothing(driver):
    backend = driver()
    await backend.create(SPEC)
    with pytest.raises(BackendError, match="cannot shrink from 107374182400 to 1073741824 bytes"):
        await backend.resize(VOLUME, GiB)
    await backend.resize(VOLUME, 100 * GiB)
    await backend.resize(VOLUME, 300 * GiB)
    assert len(backend.log.of("resize")) == 1
    assert await backend.usage(VOLUME) == Usage(used_bytes=0, limit_bytes=300 * GiB)
    assert len(backend.log.of("usage")) == 1


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("client", ["10.20.0.0/24", "*", "10.20.0.*", "slot-1.example", "fe80::1"])
async def test_only_single_slot_addresses_can_be_let_in(driver, client):
    backend = driver()
    await backend.create(SPEC)
    with pytest.raises(BackendError, match="not an IPv4 address"):
        await backend.allow(VOLUME, (A, client), read_only=False)
    assert backend.log.of("allow") == []


@pytest.mark.parametrize("driver", DRIVERS)
async def test_the_access_list_names_exactly_the_clients_given(driver):
    backend = driver()
    await backend.create(SPEC)
    await backend.allow(VOLUME, (A, B), read_only=False)
    text = repr(backend.log.of("allow"))
    assert A in text and B in text and C not in text and "*" not in text and "/24" not in text
    assert backend.volumes[VOLUME].access == {A: False, B: False}


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("spec", [VolumeSpec(VOLUME, TENANT, "data", 0), VolumeSpec(VOLUME, TENANT, "../x", GiB)])
async def test_an_invalid_volume_is_refused_before_anything_is_sent(driver, spec):
    backend = driver()
    with pytest.raises(BackendError):
        await backend.create(spec)
    assert backend.log.calls == []


@pytest.mark.parametrize("driver", DRIVERS)
async def test_a_volume_whose_name_another_holds_is_refused_and_unknown_ones_cannot_grow(driver):
    backend = driver()
    await backend.create(SPEC)
    clash = uuid.UUID(int=VOLUME.int + 1)                                    # same first 8 hex digits
    with pytest.raises(BackendError, match=f"would be named {NAME}"):
        await backend.create(VolumeSpec(clash, TENANT, "clash", GiB))
    with pytest.raises(BackendError, match="no volume"):
        await backend.resize(clash, 2 * GiB)
    assert backend.log.of("create") == backend.create_calls(SPEC)
