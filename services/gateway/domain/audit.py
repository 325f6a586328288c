"""The audit trail's pure rules (no I/O): what a mutating request (or a privileged read: AUDITED_READS) records,
how secrets are kept out of it, and how a record reads as a CADF event and as a Kubernetes ``audit.k8s.io/v1``
Event (docs/audit.md has the table).

Redaction: only PUT and PATCH bodies are recorded (the brief; a POST records its size only). In them, the value
of every member whose name (any depth, case-insensitive) is a secret's name — contains ``password``,
``passphrase``, ``secret``, ``token``, ``private``, ``credential`` or ``authorization``, or is ``key`` /
``api_key`` / ``apikey`` — is replaced by ``REDACTED``, and so is any string anywhere that looks like an API
key (``tsk_…``), whatever its member is called. Long strings are cut at MAX_STRING characters and a body whose
canonical JSON still exceeds MAX_BODY_BYTES is replaced by its member names. Headers are never recorded (the
Authorization header is the credential); an API key is identified only by its fingerprint (API_KEY_ID_CHARS hex
digits of the sha256 the database already stores as its primary key).

Before and after: a successful PUT, PATCH or DELETE also records ``change: {before, after}`` (change_of: the
target's states, read by adapters/audit_state.py, redacted and bounded like a body); CADF carries it as an
attachment named ``change``, the Kubernetes event as its ``responseObject`` (level RequestResponse).
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .keys import API_KEY_PREFIX, hash_api_key

AUDITED_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# privileged reads, recorded like mutations (by operation id): a tenant's console (what a guest prints may be a
# secret), and the bulk exports of the audit trail and of the billing data
AUDITED_READS = frozenset({"readConsole", "exportAuditRecords", "exportFocus"})
BODY_METHODS = frozenset({"PUT", "PATCH"})
CHANGE_METHODS = frozenset({"PUT", "PATCH", "DELETE"})   # updates and deletes: the target's state before and after
REDACTED = "REDACTED"
MAX_STRING = 512
MAX_BODY_BYTES = 8192
MAX_AGENT = 256
API_KEY_ID_CHARS = 16
OBSERVER = "tessera-gateway"
_SECRET_PARTS = ("password", "passphrase", "secret", "token", "private", "credential", "authorization")
_SECRET_NAMES = frozenset({"key", "api_key", "apikey"})


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def storable(text: str) -> str:
    """``text`` with what PostgreSQL text/jsonb cannot hold (NUL, lone surrogates) escaped as ``\\uXXXX``: a
    hostile request is recorded as sent, readably, instead of failing the audit write."""
    return _UNSTORABLE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def is_secret_name(name: str) -> bool:
    low = name.lower()
    return low in _SECRET_NAMES or any(part in low for part in _SECRET_PARTS)


def redact(value: Any) -> Any:
    """``value`` (parsed JSON) with every secret replaced by REDACTED and long strings cut (see the module doc)."""
    if isinstance(value, dict):
        return {storable(str(k)): REDACTED if is_secret_name(str(k)) else redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    if isinstance(value, str):
        if API_KEY_PREFIX in value:
            return REDACTED
        value = storable(value)
        return value if len(value) <= MAX_STRING else value[:MAX_STRING] + f"…({len(value)} chars)"
    if isinstance(value, float):   # the chain hashes no floats: a float becomes its JSON text
        return json.dumps(value)
    return value


def bounded_body(body: dict | None) -> dict | None:
    """The redacted body, or ``{"truncated": true, "members": [...]}`` when it is still over MAX_BODY_BYTES."""
    if body is None:
        return None
    clean = redact(body)
    size = len(json.dumps(clean, separators=(",", ":"), ensure_ascii=False).encode())
    if size > MAX_BODY_BYTES:
        return {"truncated": True, "bytes": size, "members": sorted(str(k) for k in clean)[:100]}
    return clean


def change_of(before: dict | None, after: dict | None) -> dict:
    """The ``change`` member of a successful update's record: both states redacted and bounded like a body."""
    return {"before": bounded_body(before), "after": bounded_body(after)}


def change_failed(exc: BaseException) -> dict:
    """The ``change`` member when a state could not be read: the error's type only (its text may quote data)."""
    return {"error": type(exc).__name__}


def api_key_id(key: str) -> str:
    """The non-secret id of an API key: the first hex digits of the hash the database stores for it."""
    return hash_api_key(key)[:API_KEY_ID_CHARS]


@dataclass(frozen=True)
class Target:
    type: str
    id: str | None
    params: dict[str, str]


def target_of(template: str, params: dict[str, str], method: str, status: int, created_id: str | None) -> Target:
    """What a request acted on, from its route template (``/v1/tenants/{tenant_id}/users``) and path params.

    type: the template's literal segments after /v1 joined by ``.`` (``tenants.users``, ``nodes.cordon``).
    id: the last path param named ``*_id``, else the last path param (a pool's, shape's or key's name); but a
    successful POST whose response names a new object (an ``id`` not among the params) targets that object."""
    segments = [s for s in template.split("/") if s and s != "v1"]
    literals = [s for s in segments if not s.startswith("{")]
    names = [s[1:-1] for s in segments if s.startswith("{")]
    ident = next((params.get(n) for n in reversed(names) if n.endswith("_id")), None)
    if ident is None and names:
        ident = params.get(names[-1])
    if method == "POST" and 200 <= status < 300 and created_id and created_id not in params.values():
        ident = created_id
    return Target(".".join(literals) or "root", ident, dict(params))


def outcome_of(status: int) -> str:
    return "success" if status < 400 else ("unknown" if status == 499 else "failure")


def tenant_of(actor_tenant: uuid.UUID | None, params: dict[str, str]) -> uuid.UUID | None:
    """The tenant a record belongs to (whose admins see it): the actor's, else the tenant the path names."""
    if actor_tenant is not None:
        return actor_tenant
    try:
        return uuid.UUID(params["tenant_id"]) if "tenant_id" in params else None
    except ValueError:
        return None


# --- renderings ----------------------------------------------------------------------------------------------

_CADF_ACTIONS = {"POST": "create", "PUT": "update", "PATCH": "update", "DELETE": "delete", "GET": "read"}
_K8S_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete", "GET": "get"}


def _iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def cadf(row: dict) -> dict:
    """The record as a CADF event (pycadf's required members; docs/audit.md maps each)."""
    rec, actor = row["record"], row["record"]["actor"]
    action = "authenticate" if row["action"] == "createToken" else _CADF_ACTIONS[row["method"]]
    initiator = {"typeURI": "service/security/account/user" if actor["id"] else "unknown",
                 "id": actor["id"] or "unknown", "host": {"address": actor["ip"], "agent": actor["user_agent"]}}
    if actor["tenant_id"]:
        initiator["project_id"] = actor["tenant_id"]
    event = {
        "typeURI": "http://schemas.dmtf.org/cloud/audit/1.0/event", "id": str(row["audit_id"]),
        "eventType": "activity", "eventTime": _iso(row["event_time"]), "action": action,
        "outcome": row["outcome"] if row["outcome"] != "unknown" else "pending",
        "initiator": initiator,
        "target": {"typeURI": f"tessera/{row['target_type'].replace('.', '/')}", "id": row["target_id"] or "unknown"},
        "observer": {"typeURI": "service/compute", "id": OBSERVER},
        "requestPath": row["path"],
        "reason": {"reasonType": "HTTP", "reasonCode": str(row["status"])},
        "tags": [f"operation:{row['action']}", f"request_id:{row['request_id']}"],
    }
    if rec["outcome"].get("reason"):
        event["reason"]["policyType"] = rec["outcome"]["reason"]
    if rec.get("change") is not None:   # CADF's place for data about the event: a named attachment
        event["attachments"] = [{"name": "change", "typeURI": "application/json", "content": rec["change"]}]
    return event


def k8s(row: dict) -> dict:
    """The record as a Kubernetes audit.k8s.io/v1 Event (stage ResponseComplete; level RequestResponse when the
    target's states were recorded, else Request when a body was, else Metadata). The states ride in
    ``responseObject`` as ``{before, after}``: Kubernetes' member for what the server held after the request."""
    rec, actor, target = row["record"], row["record"]["actor"], row["record"]["target"]
    body, change = rec.get("request", {}).get("body"), rec.get("change")
    resource, _, sub = row["target_type"].partition(".")
    event = {
        "kind": "Event", "apiVersion": "audit.k8s.io/v1",
        "level": "RequestResponse" if change is not None else "Request" if body is not None else "Metadata",
        "auditID": str(row["audit_id"]),
        "stage": "ResponseComplete", "requestURI": row["path"], "verb": _K8S_VERBS[row["method"]],
        "user": {"username": actor["id"] or "system:anonymous", "uid": actor["id"] or "",
                 "groups": [g for g in (actor["role"] and f"tessera:{actor['role']}",
                                        actor["tenant_id"] and f"tenant:{actor['tenant_id']}") if g]
                 or ["system:unauthenticated"]},
        "sourceIPs": [actor["ip"]] if actor["ip"] else [],
        "userAgent": actor["user_agent"] or "",
        "objectRef": {"resource": resource, "subresource": sub or None, "name": target["id"],
                      "namespace": str(row["tenant_id"]) if row["tenant_id"] else None, "apiVersion": "v1"},
        "responseStatus": {"code": row["status"]},
        "requestReceivedTimestamp": _iso(row["event_time"]), "stageTimestamp": _iso(row["created_at"]),
        "annotations": {"tessera.io/operation": row["action"], "tessera.io/request-id": row["request_id"]},
    }
    if rec["outcome"].get("reason"):
        event["responseStatus"]["reason"] = rec["outcome"]["reason"]
    if body is not None:
        event["requestObject"] = body
    if change is not None:
        event["responseObject"] = change
    return event
