"""The caller's SSH public keys (like Nova's keypairs): add, list, read, delete. Every signed-in user has their
own; nobody sees another's (another user's key is simply not found). An allocation request names them
(``key_names``) or, naming no keys at all, gets every one of them."""
from __future__ import annotations

import asyncpg
import structlog
from aiohttp import web

from ...adapters import ssh_keys as repo
from ...adapters.audit_state import StateReader, select_object
from ...domain.guest import MAX_GUEST_KEYS
from ...domain.ssh_keys import parse_public_key
from ...http.auth import principal_of
from ...http.endpoint import Endpoint, Param, respond
from ...http.inputs import path_value, read_body
from ...http.problems import ProblemError, not_found
from ...http.state import gateway_of
from .ssh_key_schemas import KeyName, SshKeyCreate, SshKeyList, SshKeyOut

log = structlog.get_logger()
MAX_KEYS_PER_USER = MAX_GUEST_KEYS    # so that "all my keys" always fits one guest
KEY_NAME = Param("name", "path", "The key's name.", KeyName, required=True)


def key_out(row: asyncpg.Record) -> SshKeyOut:
    return SshKeyOut(name=row["name"], type=row["key_type"], fingerprint=row["fingerprint"],
                     public_key=row["public_key"], comment=parse_public_key(row["public_key"]).comment,
                     created_at=row["created_at"])


async def add_key(request: web.Request) -> web.Response:
    p = principal_of(request)
    body = await read_body(request, SshKeyCreate)
    key = parse_public_key(body.public_key)      # valid: the body's type checked it
    async with gateway_of(request).pool.acquire() as conn, conn.transaction():
        await repo.lock_keys_of(conn, p.user_id)
        if await repo.count(conn, p.user_id) >= MAX_KEYS_PER_USER:
            raise ProblemError(409, f"you have {MAX_KEYS_PER_USER} keys, the most a user may keep; delete one first",
                               slug="too-many-keys")
        row = await repo.add(conn, p.user_id, body.name, key.type, body.public_key, key.fingerprint)
    if row is None:
        raise ProblemError(409, f"you already have a key named {body.name!r}", slug="name-taken")
    log.info("audit.ssh_key_added", user_id=str(p.user_id), name=body.name, fingerprint=key.fingerprint)
    return respond(key_out(row), 201, headers={"Location": f"/v1/ssh-keys/{body.name}"})


async def list_keys(request: web.Request) -> web.Response:
    p = principal_of(request)
    async with gateway_of(request).pool.acquire() as conn:
        rows = await repo.keys_of(conn, p.user_id)
    return respond(SshKeyList(items=[key_out(r) for r in rows]))


async def get_key(request: web.Request) -> web.Response:
    p = principal_of(request)
    name = path_value(request, KEY_NAME)
    async with gateway_of(request).pool.acquire() as conn:
        rows = await repo.keys_of(conn, p.user_id, [name])
    if not rows:
        raise not_found("key")
    return respond(key_out(rows[0]))


async def delete_key(request: web.Request) -> web.Response:
    p = principal_of(request)
    name = path_value(request, KEY_NAME)
    async with gateway_of(request).pool.acquire() as conn:
        deleted = await repo.delete(conn, p.user_id, name)
    if not deleted:
        raise not_found("key")
    log.info("audit.ssh_key_deleted", user_id=str(p.user_id), name=name)
    return web.Response(status=204)


def _own_key(params: dict[str, str], principal) -> tuple:
    return principal.user_id, params["name"]   # a key is its owner's: the caller's, never another user's


_SSH_KEY = StateReader(select_object("ssh_keys", "user_id = $1 AND name = $2", "name", "key_type", "fingerprint",
                                     "created_at"), _own_key)


ENDPOINTS = [
    Endpoint("POST", "/v1/ssh-keys", add_key, "addSshKey", "Store an SSH public key of the caller", "ssh-keys",
             {201: SshKeyOut}, body=SshKeyCreate, errors=(400, 401, 409, 413, 415, 422),
             headers={201: {"Location": "The key (/v1/ssh-keys/{name})."}},
             description=f"A name the caller already uses is a 409, as is a key beyond the {MAX_KEYS_PER_USER} a user "
                         "may keep. The answer carries the key's SHA-256 fingerprint (as ssh-keygen -l prints it)."),
    Endpoint("GET", "/v1/ssh-keys", list_keys, "listSshKeys", "List the caller's SSH public keys", "ssh-keys",
             {200: SshKeyList}, errors=(401,)),
    Endpoint("GET", "/v1/ssh-keys/{name}", get_key, "getSshKey", "Read one of the caller's SSH public keys",
             "ssh-keys", {200: SshKeyOut}, params=(KEY_NAME,), errors=(401, 404, 422)),
    Endpoint("DELETE", "/v1/ssh-keys/{name}", delete_key, "deleteSshKey", "Delete one of the caller's SSH public keys",
             "ssh-keys", {204: None}, params=(KEY_NAME,), errors=(401, 404, 422),
             description="Allocations already requested keep the keys they were given.",
             audit_state=_SSH_KEY),
]
