"""The gateway's pure rules for guests, checked without I/O: OpenSSH public keys (parsing, the document's pattern,
the fingerprint ssh-keygen prints), hostnames from allocation names, which keys a guest gets, who sees an image,
and the image catalog's field rules."""
from __future__ import annotations

import base64
import os
import random
import re
import struct
import uuid

import pytest
from pydantic import ValidationError

from services.gateway.api.identity.ssh_key_schemas import SshKeyCreate
from services.gateway.api.inventory.image_schemas import ImageCreate
from services.gateway.domain.guest import guest_keys, hostname_for, may_see_image
from services.gateway.domain.ssh_keys import KEY_TYPES, PUBLIC_KEY_PATTERN, BadKey, explain_public_key, parse_public_key

# made with ssh-keygen -t ed25519 / -t rsa, fingerprints as `ssh-keygen -l` printed them
ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE2ZZdnE/RtlHeGDHHC2CVZeBzgkzYhgCfhP2TXh3PAj ada@example"
ED25519_FP = "SHA256:jXDzZhpNJ4qFAC9DuV+Gk7sr4eF38ZzAp4rdOf5hJ3I"
RSA = ("ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABgQDIUoBp+qsAfXNzrWQnUFljUeKPCfB5krmsDwZxbHri7EIQ2bF97GIOvjvr6sfsavnTU2ThZ"
       "sJtdpPt9vXqEZMJe89y212X8G5DAEBi/KJ+jZBAtFLZJp/HiO68KyzTT0U1Dt5jhaase1Oqgqi8UrGyTLHX8XplK5h+yqlGjv9E7aWrAfrZWZ1KY"
       "SE/P58aEUYfVNkP/KFv6mPebpW2UVgP22fF02A0yNxPAkg69i3Ms5DvEQJlVBX96T/hmYOmgR3cv/O78cvU7ASXTIUrHj6C13RRTT6Bkpfcf97Tr2"
       "R12XLv4+WCODrqUZHmVuwDYwzMde2ghiUUS69JCSySh2+RjkAZVHrQkrKGhmveo5YHj/thOiz/We4Sc+rxdX8o3Yow9djgfy/yEn9hKXSxsven0b"
       "sSoTKbJxmgLtJ/SlA8ShpCy+xXlR1qiK58o7/iAVOWoHCdzOtUvOTLo/4cDKMyzKdCtCCdYcM3CswtXqbSpOoUxR+6wDHOm0jqZHEniv0= ada@example")
RSA_FP = "SHA256:SaAiT/4dnRg1WLY2W/3lZ1zZ7RgyXRKz9qfnjGYwI8U"
P521 = ("ecdsa-sha2-nistp521 AAAAE2VjZHNhLXNoYTItbmlzdHA1MjEAAAAIbmlzdHA1MjEAAACFBADXn/7fn8hGIUbcDt7MI7jKA8diBdg2YZj8wvYh0"
        "Ujo2BaFVlvyZS0C8mEshBRcRqoxwInEKJWRa7l5YsrmHi/r/QEWxSV944ga78kbfEr6cpzu7jQjlqrOkenuSIqUP0Q1dKpYeZyG4PRMGrzv7SbGgsT4"
        "QesoiFCjHjuLXkDdxDD4lw== ")
P521_FP = "SHA256:tkrfwalZhq/np5iqldmj6SbQO6ZdFzsm8iCiSyoqc6w"


def _ssh_string(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def synthetic_key(key_type: str, blob_type: str | None = None, extra: bytes | None = None, comment: str = "") -> str:
    blob = _ssh_string((blob_type or key_type).encode()) + (os.urandom(32) if extra is None else extra)
    return f"{key_type} {base64.b64encode(blob).decode()}" + (f" {comment}" if comment else "")


@pytest.mark.parametrize(("line", "fingerprint", "key_type", "comment"), [
    (ED25519, ED25519_FP, "ssh-ed25519", "ada@example"), (RSA, RSA_FP, "ssh-rsa", "ada@example"),
    (P521, P521_FP, "ecdsa-sha2-nistp521", "")])
def test_a_real_key_parses_with_the_fingerprint_ssh_keygen_prints(line, fingerprint, key_type, comment):
    key = parse_public_key(line)
    assert (key.type, key.fingerprint, key.comment) == (key_type, fingerprint, comment)
    assert re.fullmatch(PUBLIC_KEY_PATTERN, line)


@pytest.mark.parametrize("key_type", KEY_TYPES)
def test_every_key_type_is_accepted_with_or_without_a_comment(key_type):
    for comment in ("", "ada@example", "a comment with spaces – and unicode"):
        line = synthetic_key(key_type, comment=comment)
        assert parse_public_key(line).comment == comment
        assert re.fullmatch(PUBLIC_KEY_PATTERN, line), line


@pytest.mark.parametrize(("line", "why"), [
    (ED25519 + "\n" + RSA, "one line"),
    ("ssh-dss AAAAB3NzaC1kc3M=", "key type must be one of"),
    ("ssh-ed25519", "base64"),
    ("ssh-ed25519  AAAAC3NzaC1lZDI1NTE5", "base64"),
    ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE2ZZdnE!RtlHeGDHHC2", "base64"),
    ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE2ZZdnE/RtlHeGDHHC2CVZeBzgkzYhgCfhP2TXh3PA", "base64"),   # length % 4
    (synthetic_key("ssh-rsa", blob_type="ssh-ed25519"), "not a ssh-rsa key"),
    (synthetic_key("ssh-ed25519", extra=b""), "not a ssh-ed25519 key"),                          # only the type
    (synthetic_key("ssh-ed25519", comment="bell\x07"), "control characters"),
    (synthetic_key("ssh-rsa", extra=os.urandom(13000)), "at most 16384"),
])
def test_what_is_not_a_key_is_refused_saying_why(line, why):
    with pytest.raises(BadKey, match=why):
        parse_public_key(line)
    assert not re.fullmatch(PUBLIC_KEY_PATTERN, line) or len(line) > 16384
    assert why in explain_public_key(line)


def test_the_documents_pattern_accepts_exactly_what_the_server_accepts():
    rnd = random.Random(7)
    for _ in range(3000):
        key_type = rnd.choice(KEY_TYPES)
        blob = _ssh_string(rnd.choice([key_type, rnd.choice(KEY_TYPES)]).encode()) + rnd.randbytes(rnd.randint(0, 6))
        blob = blob[:rnd.randint(0, len(blob))] if rnd.random() < 0.2 else blob
        encoded = base64.b64encode(blob).decode()
        encoded = encoded[:-1] if rnd.random() < 0.1 else encoded
        line = f"{key_type} {encoded}" + (" c" if rnd.random() < 0.5 else "")
        assert bool(re.fullmatch(PUBLIC_KEY_PATTERN, line)) == (explain_public_key(line) is None), line


def test_the_key_body_refuses_a_bad_key_naming_the_field():
    SshKeyCreate.model_validate({"name": "laptop", "public_key": ED25519})
    with pytest.raises(ValidationError) as err:
        SshKeyCreate.model_validate({"name": "laptop", "public_key": "ssh-ed25519 AAAA"})
    assert [(e["loc"], e["type"]) for e in err.value.errors()] == [(("public_key",), "ssh_public_key")]


@pytest.mark.parametrize(("name", "hostname"), [
    ("train-1", "train-1"), ("Train_Job.V2", "train-job-v2"), ("a..b__c", "a-b-c"), ("-x-", "x"),
    ("A" * 70, "a" * 63), ("a" * 62 + ".b", "a" * 62), ("..", "vm-12345678"), ("_", "vm-12345678"),
])
def test_a_hostname_is_a_valid_label_made_from_the_allocations_name(name, hostname):
    allocation_id = uuid.UUID("12345678-0000-4000-8000-000000000000")
    made = hostname_for(name, allocation_id)
    assert made == hostname
    assert re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", made)


def test_a_guest_gets_the_stored_keys_only_when_the_request_names_none():
    stored = ["k1", "k2"]
    assert guest_keys(None, None, stored) == ["k1", "k2"]
    assert guest_keys([], None, stored) == []
    assert guest_keys(None, ["k2"], stored) == ["k2"]
    assert guest_keys(["x", "k2"], ["k2", "k1"], stored) == ["x", "k2", "k1"]


def test_tenants_see_public_images_and_their_own_private_ones_admins_all():
    mine, other = uuid.uuid4(), uuid.uuid4()
    assert may_see_image(None, "public", caller_tenant=mine, provider_admin=False)
    assert may_see_image(mine, "private", caller_tenant=mine, provider_admin=False)
    assert not may_see_image(other, "private", caller_tenant=mine, provider_admin=False)
    assert may_see_image(other, "private", caller_tenant=None, provider_admin=True)


IMAGE = {"name": "ubuntu-24.04", "os": "Ubuntu 24.04", "format": "qcow2", "source": "/var/lib/images/u.qcow2",
         "sha256": "0" * 64, "visibility": "public"}


@pytest.mark.parametrize(("over", "fields"), [
    ({}, []),
    ({"visibility": "private"}, ["tenant_id"]),
    ({"visibility": "private", "tenant_id": str(uuid.uuid4())}, []),
    ({"tenant_id": str(uuid.uuid4())}, ["tenant_id"]),
    ({"visibility": "private", "tenant_id": str(uuid.uuid4()), "default": True}, ["default"]),
    ({"initrd": "/boot/initrd.img", "kernel_args": "console=ttyS0"}, ["initrd", "kernel_args"]),
    ({"kernel": "/boot/vmlinuz", "initrd": "/boot/initrd.img", "kernel_args": "console=ttyS0"}, []),
    ({"name": str(uuid.UUID(int=7))}, ["name"]),
])
def test_the_image_rules_between_fields_name_the_field(over, fields):
    assert [f for f, _ in ImageCreate.model_validate({**IMAGE, **over}).rule_errors()] == fields


@pytest.mark.parametrize("source", ["/images/u.qcow2", "https://images.example.com/u.qcow2", "http://10.0.0.1:8080/u.raw",
                                    "http://[fd00::1]/u.raw"])
def test_an_image_source_is_an_absolute_path_or_an_http_url(source):
    ImageCreate.model_validate({**IMAGE, "source": source})


@pytest.mark.parametrize("source", ["images/u.qcow2", "ftp://host/u.qcow2", "file:///u.qcow2", "/a b", "https://",
                                    "/" + "a" * 1024, "/u\x00"])
def test_anything_else_is_not_a_source(source):
    with pytest.raises(ValidationError):
        ImageCreate.model_validate({**IMAGE, "source": source})
