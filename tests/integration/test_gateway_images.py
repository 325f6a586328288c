"""The image catalog and users' SSH keys through the gateway, and what an allocation request makes of them: the
Guest snapshot (image, hostname, keys) the allocation.request command carries."""
from __future__ import annotations

import base64
import os
import struct
import uuid

import pytest

from tests.support.gateway import assert_problem
from tests.support.polling import eventually

SHA = "ab" * 32


def image_body(**over) -> dict:
    body = {"name": f"img-{uuid.uuid4().hex[:10]}", "os": "Ubuntu 24.04", "format": "qcow2",
            "source": "https://images.example.com/ubuntu-24.04.qcow2", "sha256": SHA, "min_disk_gb": 20,
            "visibility": "public"}
    body.update(over)
    return body


def public_key(comment: str = "ada@example", key_type: str = "ssh-ed25519") -> str:
    blob = struct.pack(">I", len(key_type)) + key_type.encode() + struct.pack(">I", 32) + os.urandom(32)
    return f"{key_type} {base64.b64encode(blob).decode()} {comment}".rstrip()


def alloc_body(**over) -> dict:
    body = {"name": f"a-{uuid.uuid4().hex[:8]}", "shape": "vm.1gpu"}
    body.update(over)
    return body


@pytest.fixture
async def catalog(api):
    """Adds images as the provider admin; deletes them after the test (the default image is everyone's)."""
    admin = await api.admin()
    made = []

    async def _add(**over) -> dict:
        r = await admin.post("/v1/images", image_body(**over))
        assert r.status == 201, r.body
        made.append(r.body["id"])
        return r.body

    yield _add
    for image_id in made:
        await admin.delete(f"/v1/images/{image_id}")


async def guest_of(commands, allocation_id: str) -> dict | None:
    [hit] = await commands.wait_for(lambda i: i[1]["data"]["allocation_id"] == allocation_id)
    return hit[1]["data"].get("guest")


# --- the catalog ----------------------------------------------------------------------------------------------

async def test_an_admin_adds_reads_lists_and_deletes_an_image(api, catalog):
    admin = await api.admin()
    img = await catalog(kernel="/boot/vmlinuz-6.8", initrd="/boot/initrd-6.8", kernel_args="console=ttyS0 quiet")
    assert img["default"] is False and img["tenant_id"] is None and img["kernel_args"] == "console=ttyS0 quiet"
    assert img["links"]["self"] == f"/v1/images/{img['id']}"
    got = await admin.get(img["links"]["self"])
    assert got.status == 200 and got.body == img
    again = await admin.post("/v1/images", image_body(name=img["name"]))
    assert_problem(again, 409)
    user, _ = await api.tenant_user()
    assert (await user.get(img["links"]["self"])).body["name"] == img["name"]
    assert_problem(await user.delete(img["links"]["self"]), 403)
    assert (await admin.delete(img["links"]["self"])).status == 204
    assert_problem(await admin.get(img["links"]["self"]), 404)
    assert_problem(await admin.delete(img["links"]["self"]), 404)
    assert_problem(await user.post("/v1/images", image_body()), 403)


async def test_a_private_image_is_seen_by_its_tenant_and_the_admins_only(api, catalog):
    admin = await api.admin()
    alice, alice_tenant = await api.tenant_user()
    bob, _ = await api.tenant_user()
    private = await catalog(visibility="private", tenant_id=alice_tenant)
    public = await catalog()

    async def listed(client) -> set[str]:
        seen, cursor = set(), None
        while True:
            page = (await client.get("/v1/images?limit=100" + (f"&cursor={cursor}" if cursor else ""))).body
            seen |= {i["id"] for i in page["items"]}
            if not (cursor := page["next_cursor"]):
                return seen
    assert {private["id"], public["id"]} <= await listed(alice)
    assert {private["id"], public["id"]} <= await listed(admin)
    bobs = await listed(bob)
    assert public["id"] in bobs and private["id"] not in bobs
    assert (await alice.get(private["links"]["self"])).status == 200
    assert_problem(await bob.get(private["links"]["self"]), 404)
    assert_problem(await bob.get(f"/v1/images/{uuid.uuid4()}"), 404)
    assert_problem(await bob.get("/v1/images/not-a-uuid"), 404)


async def test_images_are_paged_newest_first(api, catalog):
    made = [(await catalog())["id"] for _ in range(3)]
    admin = await api.admin()
    first = (await admin.get("/v1/images?limit=2")).body
    assert [i["id"] for i in first["items"]] == made[::-1][:2] and first["next_cursor"]
    second = (await admin.get(f"/v1/images?limit=2&cursor={first['next_cursor']}")).body
    assert second["items"][0]["id"] == made[0]
    assert_problem(await admin.get("/v1/images?cursor=garbage"), 422, "cursor")


@pytest.mark.parametrize(("over", "field"), [
    ({"name": "Ubuntu"}, "name"), ({"name": "u" * 64}, "name"), ({"name": ""}, "name"), ({"name": str(uuid.UUID(int=7))}, "name"),
    ({"os": "Ubuntu\u0000"}, "os"), ({"os": "o" * 64}, "os"), ({"os": "bell\u0007"}, "os"),
    ({"format": "vmdk"}, "format"),
    ({"source": "images/u.qcow2"}, "source"), ({"source": "ftp://h/u.qcow2"}, "source"),
    ({"source": "/u\u0000.qcow2"}, "source"), ({"source": "/" + "u" * 1024}, "source"),
    ({"sha256": SHA.upper()}, "sha256"), ({"sha256": SHA[:-1]}, "sha256"),
    ({"min_disk_gb": 0}, "min_disk_gb"), ({"min_disk_gb": 65537}, "min_disk_gb"), ({"min_disk_gb": "20"}, "min_disk_gb"),
    ({"visibility": "shared"}, "visibility"),
    ({"visibility": "private"}, "tenant_id"), ({"tenant_id": str(uuid.uuid4())}, "tenant_id"),
    ({"visibility": "private", "tenant_id": "not-a-uuid"}, "tenant_id"),
    ({"visibility": "private", "tenant_id": str(uuid.uuid4())}, "tenant_id"),      # no such tenant
    ({"kernel": "vmlinuz"}, "kernel"), ({"initrd": "/boot/initrd"}, "initrd"),
    ({"kernel_args": "quiet"}, "kernel_args"), ({"kernel": "/k", "kernel_args": "a\u0000b"}, "kernel_args"),
    ({"kernel": "/k", "kernel_args": "a" * 1025}, "kernel_args"),
    ({"default": "yes"}, "default"), ({"default": True, "visibility": "private"}, "default"),
    ({"id": str(uuid.uuid4())}, "id"), ({"disk_format": "qcow2"}, "disk_format"),
])
async def test_every_image_field_is_checked_at_the_boundary(api, over, field):
    admin = await api.admin()
    before = await api.scalar("SELECT count(*) FROM images")
    body = image_body(**over)
    if "visibility" in over and over.get("default"):
        body["tenant_id"] = await api.new_tenant()
    problem = assert_problem(await admin.post("/v1/images", body), 422, field)
    if field == "tenant_id" and over.get("visibility") == "private" and "tenant_id" in over:
        assert over["tenant_id"] in problem["detail"] or over["tenant_id"] == "not-a-uuid"
    assert await api.scalar("SELECT count(*) FROM images") == before


async def test_the_default_image_is_what_an_allocation_naming_none_boots_and_there_is_only_one(api, catalog, watch):
    admin = await api.admin()
    commands = await watch("allocation.cmd.request")
    client, _ = await api.tenant_user()
    first = await catalog(default=True)
    a = (await client.post("/v1/allocations", alloc_body())).body
    assert a["image"] == first["name"]
    assert (await guest_of(commands, a["id"]))["image"]["image_id"] == first["id"]
    second = await catalog(default=True)
    assert (await admin.get(first["links"]["self"])).body["default"] is False
    assert (await admin.get(second["links"]["self"])).body["default"] is True
    assert await api.scalar("SELECT count(*) FROM images WHERE is_default") == 1
    # registering the default again under its taken name is a 409 that changes nothing (./taskw up does it at
    # every start): the default keeps its mark
    again = {k: v for k, v in second.items() if k in image_body()}
    assert_problem(await admin.post("/v1/images", {**again, "default": True}), 409)
    assert (await admin.get(second["links"]["self"])).body["default"] is True
    b = (await client.post("/v1/allocations", alloc_body())).body
    assert b["image"] == second["name"]
    # the default deleted, the catalog has none: an allocation naming no image gets no guest
    assert (await admin.delete(second["links"]["self"])).status == 204
    c = (await client.post("/v1/allocations", alloc_body())).body
    assert c["image"] is None and await guest_of(commands, c["id"]) is None
    assert (await client.get(f"/v1/allocations/{a['id']}")).body["image"] == first["name"]   # its snapshot stays


# --- SSH keys ---------------------------------------------------------------------------------------------------

async def test_a_user_stores_lists_reads_and_deletes_their_keys_and_sees_no_one_elses(api):
    ada, _ = await api.tenant_user()
    bob, _ = await api.tenant_user()
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE2ZZdnE/RtlHeGDHHC2CVZeBzgkzYhgCfhP2TXh3PAj ada@example"
    r = await ada.post("/v1/ssh-keys", {"name": "laptop", "public_key": key})
    assert r.status == 201 and r.headers["Location"] == "/v1/ssh-keys/laptop"
    assert r.body["fingerprint"] == "SHA256:jXDzZhpNJ4qFAC9DuV+Gk7sr4eF38ZzAp4rdOf5hJ3I"   # as ssh-keygen -l printed it
    assert (r.body["type"], r.body["comment"], r.body["public_key"]) == ("ssh-ed25519", "ada@example", key)
    assert_problem(await ada.post("/v1/ssh-keys", {"name": "laptop", "public_key": public_key()}), 409)
    assert (await bob.post("/v1/ssh-keys", {"name": "laptop", "public_key": public_key()})).status == 201
    assert [k["name"] for k in (await ada.get("/v1/ssh-keys")).body["items"]] == ["laptop"]
    assert (await ada.get("/v1/ssh-keys/laptop")).body == r.body
    assert (await bob.get("/v1/ssh-keys/laptop")).body["fingerprint"] != r.body["fingerprint"]
    assert (await bob.delete("/v1/ssh-keys/laptop")).status == 204
    assert_problem(await bob.get("/v1/ssh-keys/laptop"), 404)
    assert (await ada.get("/v1/ssh-keys/laptop")).status == 200                      # bob deleted only his own
    assert_problem(await ada.delete("/v1/ssh-keys/desktop"), 404)


@pytest.mark.parametrize(("body", "field"), [
    ({"name": "bad name", "public_key": public_key()}, "name"),
    ({"name": "k\u0000", "public_key": public_key()}, "name"),
    ({"name": "k", "public_key": public_key() + "\n" + public_key()}, "public_key"),
    ({"name": "k", "public_key": "ssh-dss AAAAB3NzaC1kc3MAAAA="}, "public_key"),
    ({"name": "k", "public_key": "ssh-ed25519 not*base64"}, "public_key"),
    ({"name": "k", "public_key": public_key().replace("ssh-ed25519", "ssh-rsa", 1)}, "public_key"),
    ({"name": "k", "public_key": public_key(comment="bell\u0007")}, "public_key"),
    ({"name": "k", "public_key": public_key(comment="x" * 16400)}, "public_key"),
    ({"name": "k"}, "public_key"),
    ({"name": "k", "public_key": public_key(), "fingerprint": "SHA256:x"}, "fingerprint"),
])
async def test_a_key_that_is_not_one_openssh_public_key_is_refused_naming_the_field(api, body, field):
    client, _ = await api.tenant_user()
    assert_problem(await client.post("/v1/ssh-keys", body), 422, field)
    assert (await client.get("/v1/ssh-keys")).body["items"] == []


# --- allocations with an image and keys ---------------------------------------------------------------------------

async def test_an_allocation_sends_the_snapshot_of_its_image_its_hostname_and_the_keys_it_names(api, catalog, watch):
    commands = await watch("allocation.cmd.request")
    client, _ = await api.tenant_user()
    img = await catalog(kernel="/boot/vmlinuz", kernel_args="console=ttyS0")
    stored = [public_key("one"), public_key("two")]
    for name, key in zip(("one", "two"), stored):
        assert (await client.post("/v1/ssh-keys", {"name": name, "public_key": key})).status == 201
    given = public_key("given", "ecdsa-sha2-nistp256")
    r = await client.post("/v1/allocations", alloc_body(name="Train_Job.1", image=img["name"], ssh_keys=[given],
                                                        key_names=["two"]))
    assert r.status == 202 and r.body["image"] == img["name"] and r.body["instance"] is None
    guest = await guest_of(commands, r.body["id"])
    assert guest["hostname"] == "train-job-1" and guest["ssh_keys"] == [given, stored[1]]
    assert guest["image"] == {"image_id": img["id"], "name": img["name"], "os": "Ubuntu 24.04", "format": "qcow2",
                              "source": img["source"], "sha256": SHA, "min_disk_gb": 20, "kernel": "/boot/vmlinuz",
                              "initrd": None, "kernel_args": "console=ttyS0"}
    # by id, and naming no keys: every stored key
    by_id = await client.post("/v1/allocations", alloc_body(image=img["id"]))
    assert by_id.status == 202 and by_id.body["image"] == img["name"]
    assert (await guest_of(commands, by_id.body["id"]))["ssh_keys"] == stored
    assert (await client.get(f"/v1/allocations/{by_id.body['id']}")).body["image"] == img["name"]
    # an empty list means no key at all
    none = await client.post("/v1/allocations", alloc_body(image=img["name"], ssh_keys=[]))
    assert (await guest_of(commands, none.body["id"]))["ssh_keys"] == []


async def test_an_image_the_caller_may_not_see_or_an_unknown_key_name_is_a_422_and_creates_nothing(api, catalog):
    client, tenant_id = await api.tenant_user()
    other_tenant = await api.new_tenant()
    hidden = await catalog(visibility="private", tenant_id=other_tenant)
    own = await catalog(visibility="private", tenant_id=tenant_id)
    for ref in (hidden["name"], hidden["id"], "no-such-image", str(uuid.uuid4())):
        problem = assert_problem(await client.post("/v1/allocations", alloc_body(image=ref)), 422, "image")
        assert ref in problem["detail"]
    problem = assert_problem(await client.post("/v1/allocations", alloc_body(image=own["name"], key_names=["nope"])),
                             422, "key_names.0")
    assert "nope" in problem["detail"]
    assert (await client.post("/v1/ssh-keys", {"name": "stored", "public_key": public_key()})).status == 201
    too_many = alloc_body(image=own["name"], ssh_keys=[public_key(f"k{n}") for n in range(32)], key_names=["stored"])
    assert "33 keys" in assert_problem(await client.post("/v1/allocations", too_many), 422, "ssh_keys")["errors"][0]["message"]
    for bad, field in (({"image": "Bad Name"}, "image"), ({"ssh_keys": ["ssh-ed25519 AAAA"]}, "ssh_keys.0"),
                       ({"ssh_keys": [public_key()] * 33}, "ssh_keys"), ({"key_names": ["a b"]}, "key_names.0"),
                       ({"instance": {}}, "instance"), ({"image": None}, "image")):
        assert_problem(await client.post("/v1/allocations", alloc_body(**bad)), 422, field)
    assert await api.scalar("SELECT count(*) FROM allocations_view WHERE tenant_id=$1", uuid.UUID(tenant_id)) == 0
    assert (await client.post("/v1/allocations", alloc_body(image=own["name"]))).status == 202


async def test_an_idempotent_retry_is_answered_the_same_even_once_its_image_is_gone(api, catalog):
    admin = await api.admin()
    client, tenant_id = await api.tenant_user()
    img = await catalog()
    key, body = f"k-{uuid.uuid4()}", alloc_body(image=img["name"], ssh_keys=[public_key()])
    first = await client.post("/v1/allocations", body, headers={"Idempotency-Key": key})
    assert first.status == 202
    assert (await admin.delete(img["links"]["self"])).status == 204
    again = await client.post("/v1/allocations", body, headers={"Idempotency-Key": key})
    assert again.status == 202 and again.body == first.body and again.headers["Idempotent-Replayed"] == "true"
    other = await client.post("/v1/allocations", {**body, "ssh_keys": []}, headers={"Idempotency-Key": key})
    assert_problem(other, 422, "Idempotency-Key")
    await eventually(lambda: api.commands_of("allocation.request", tenant_id), timeout=5, until=lambda n: n == 1)
