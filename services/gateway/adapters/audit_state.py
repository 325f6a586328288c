"""What an update or delete acted on, as the gateway's own tables and views show it (asyncpg): one state reader
per PUT, PATCH and DELETE operation of contracts/openapi.json, so the audit middleware (http/audit.py) can record
the target's state before and after the request.

A reader is one SELECT of a ``jsonb_build_object`` naming only what describes the target (a quota's limits, a
node's status, cordon and labels, a volume's size and state, a budget's amount, thresholds and webhook url…),
never a secret: a BMC's sealed password and CA bundle, a budget's webhook secret and key hashes are not selected
(and the middleware passes every state through domain.audit.redact anyway). It answers the JSON-ready state, or
None when there is none (no such row, or a path value that cannot name one: a malformed uuid). Readers only read,
may block on the database, and raise whatever asyncpg raises.

Many commands are asynchronous (202: the view changes when the owning service's event arrives), so right after
such a request ``after`` may still equal ``before``; the recorded request body is the requested state.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import asyncpg

from ..domain.audit import storable

NIL = uuid.UUID(int=0)   # quotas_view / volume_quotas_view: the tenant's own row (no user)

Args = Callable[[dict[str, str], Any], tuple | None]


@dataclass(frozen=True)
class StateReader:
    """``sql`` selects one jsonb value (the state) from ``args(path params, principal)``; args None: no target."""
    sql: str
    args: Args

    async def __call__(self, conn: asyncpg.Connection, params: dict[str, str], principal) -> dict | None:
        try:
            values = self.args(params, principal)
        except (KeyError, ValueError, AttributeError):   # a malformed uuid, or no principal: it names nothing
            return None
        if values is None or any(isinstance(v, str) and storable(v) != v for v in values):
            return None   # a NUL or lone surrogate (hostile input) names no row and PostgreSQL refuses it
        state = await conn.fetchval(self.sql, *values)
        return json.loads(state) if isinstance(state, str) else state


def _ids(*names: str) -> Args:
    return lambda params, _principal: tuple(uuid.UUID(params[n]) for n in names)


def _plain(*names: str) -> Args:
    return lambda params, _principal: tuple(params[n] for n in names)


def _quota(user: bool) -> Args:
    def args(params: dict[str, str], _principal) -> tuple:
        return (uuid.UUID(params["tenant_id"]), params["pool"], params["gpu_model"],
                uuid.UUID(params["user_id"]) if user else NIL)
    return args


def _storage_quota(user: bool) -> Args:
    def args(params: dict[str, str], _principal) -> tuple:
        return uuid.UUID(params["tenant_id"]), params["storage_class"], uuid.UUID(params["user_id"]) if user else NIL
    return args


def _own_key(params: dict[str, str], principal) -> tuple:
    return principal.user_id, params["name"]   # a key is its owner's: the caller's, never another user's


def _obj(table: str, where: str, *members: str) -> str:
    pairs = ", ".join(f"'{m.strip(chr(34))}', {m}" for m in members)
    return f"SELECT jsonb_build_object({pairs}) FROM {table} WHERE {where}"


_NODE = _obj("nodes_view", "id = $1", "name", "status", "cordoned", "labels", "taints", "pool", "region", "site",
             "rack", "gpu_model", "gpu_count", "quarantined", "version")
_BMC = _obj("node_bmcs", "node_id = $1 AND url IS NOT NULL", "url", "system_id", "username", "verify_tls", "version",
            "set_by", "updated_at")
_SHAPE = _obj("shapes_view", "name = $1", "kind", "gpu_count", "gpu_model", "mig_profile", "deleted", "version")
_QUOTA = _obj("quotas_view", "tenant_id = $1 AND pool = $2 AND gpu_model = $3 AND user_id = $4",
              '"limit"', "guaranteed", "used", "version")
_STORAGE_QUOTA = _obj("volume_quotas_view", "tenant_id = $1 AND storage_class = $2 AND user_id = $3",
                      "max_bytes", "max_volumes", "effective_max_bytes", "effective_max_volumes", "version")
_VOLUME = _obj("volumes_view", "id = $1", "name", "storage_class", "size_bytes", "pending_size_bytes", "state",
               "attachments", "version")
_BUDGET = _obj("budgets_view", "tenant_id = $1", "amount_minor", "currency", "thresholds", "webhook_url", "version")
_SPEND_CAP = _obj("tenant_spend_caps", "tenant_id = $1", "amount_minor", "currency", "set_by", "set_at")
_POLICY = _obj("policies", "id = $1 AND ($2::uuid IS NULL OR tenant_id = $2)", "scope", "tenant_id", "name", "version",
               "enabled", "text")


_RATE_LIMITS = _obj("tenant_rate_limits", "tenant_id = $1", "read_per_s", "read_burst", "write_per_s", "write_burst",
                    "user_read_per_s", "user_read_burst", "user_write_per_s", "user_write_burst", "sse_connections",
                    "set_by", "set_at")
_API_KEY = ("SELECT jsonb_build_object('id', k.id, 'name', k.name, 'expires_at', k.expires_at, 'revoked_at', "
            "k.revoked_at) FROM api_keys k JOIN users u ON u.id = k.user_id "
            "WHERE u.tenant_id = $1 AND k.user_id = $2 AND k.id = $3")
_USER = _obj("users", "tenant_id = $1 AND id = $2", "name", "role", "disabled_at")


def _api_key(params: dict[str, str], _principal) -> tuple:
    return uuid.UUID(params["tenant_id"]), uuid.UUID(params["user_id"]), params["key_id"]


def _policy(params: dict[str, str], principal) -> tuple:
    return uuid.UUID(params["policy_id"]), principal.tenant_id   # a tenant admin reads its own tenant's only

STATE_READERS: dict[str, Callable[..., Awaitable[dict | None]]] = {
    "deleteSshKey": StateReader(_obj("ssh_keys", "user_id = $1 AND name = $2", "name", "key_type", "fingerprint",
                                     "created_at"), _own_key),
    "updateNode": StateReader(_NODE, _ids("node_id")),
    "setNodeBmc": StateReader(_BMC, _ids("node_id")),
    "deleteNodeBmc": StateReader(_BMC, _ids("node_id")),
    "definePool": StateReader(_obj("pools_view", "name = $1", "policy", "taints", "description", "version"),
                              _plain("name")),
    "defineShape": StateReader(_SHAPE, _plain("name")),
    "deleteShape": StateReader(_SHAPE, _plain("name")),
    "deleteImage": StateReader(_obj("images", "id = $1", "name", "os", "format", "visibility", "tenant_id",
                                    "min_disk_gb", "is_default"), _ids("image_id")),
    "setTenantQuota": StateReader(_QUOTA, _quota(user=False)),
    "setUserQuota": StateReader(_QUOTA, _quota(user=True)),
    "releaseAllocation": StateReader(_obj("allocations_view", "id = $1", "name", "state", "shape", "gpu_count",
                                          "node_id", "release_requested_at"), _ids("allocation_id")),
    "deleteNetwork": StateReader(_obj("networks_view", "id = $1", "name", "state", "reason"), _ids("network_id")),
    "removeNetworkRule": StateReader(_obj("network_rules_view", "id = $2 AND network_id = $1", "direction",
                                          "protocol", "port_from", "port_to", "remote_network_id", "remote_cidr",
                                          "state"), _ids("network_id", "rule_id")),
    "setTenantStorageQuota": StateReader(_STORAGE_QUOTA, _storage_quota(user=False)),
    "setUserStorageQuota": StateReader(_STORAGE_QUOTA, _storage_quota(user=True)),
    "resizeVolume": StateReader(_VOLUME, _ids("volume_id")),
    "deleteVolume": StateReader(_VOLUME, _ids("volume_id")),
    "detachVolume": StateReader(_VOLUME, _ids("volume_id")),
    "putPriceList": StateReader(_obj("price_lists_view", "version = $1", "currency", "effective_from", "body",
                                     "published_by", "published_at"), _plain("version")),
    "putBudget": StateReader(_BUDGET, _ids("tenant_id")),
    "deleteBudget": StateReader(_BUDGET, _ids("tenant_id")),
    "putSpendCap": StateReader(_SPEND_CAP, _ids("tenant_id")),
    "replacePolicy": StateReader(_POLICY, _policy),
    "revokeApiKey": StateReader(_API_KEY, _api_key),
    "putRateLimits": StateReader(_RATE_LIMITS, _ids("tenant_id")),
    "deleteRateLimits": StateReader(_RATE_LIMITS, _ids("tenant_id")),
    "updateUser": StateReader(_USER, _ids("tenant_id", "user_id")),
    "deletePolicy": StateReader(_POLICY, _policy),
    "deleteSpendCap": StateReader(_SPEND_CAP, _ids("tenant_id")),
}
