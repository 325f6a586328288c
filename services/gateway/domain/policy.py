"""Policy as code (pure, no I/O): the Cedar schema of Tessera's principals, actions and resources, checking a policy
against it, and deciding a request under the provider's and the caller's tenant's policies.

The decision is layered by Cedar's own rule, forbid overrides permit: every set holds one base ``permit`` (roles
stay enforced in code; policies only take away), the provider's policies (the defaults in policy_defaults.cedar
and those stored with scope ``provider``) and, for a tenant's member, that tenant's policies and no other's. So a
tenant's ``forbid`` narrows what its members may do, and a tenant's ``permit`` can never lift a provider ``forbid``
(it only repeats the base permit).

Every stored policy is exactly one static Cedar policy; in a set it is keyed by its stored id (a default by its
``@id``). A denial names the policy by its ``@id`` annotation when it has one (what its author calls it), and
carries the stored id beside it. Its ``@reason`` annotation, if any, is the denial's reason.
"""
from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import cedarpy

NAMESPACE = "Tessera"
BASE_PERMIT_ID = "tessera.base-permit"
MUTATE = "mutate"                          # the action group every mutating operation is in
DEFAULTS_FILE = Path(__file__).with_name("policy_defaults.cedar")
MAX_POLICY_CHARS = 10_000

# the resource an operation acts on, when it is more than a generic Target; every type also has ``operation``,
# ``tenant`` (the caller's; "" for a provider admin) and string tags (path parameters, top-level scalar body
# fields, an allocation's labels)
RESOURCE_ATTRIBUTES: dict[str, str] = {
    "Allocation": "name: String, shape: String, gpu_count: Long, gpu_model?: String, pool: String, image?: String, "
                  "image_approved: Bool, spot: Bool, privileged: Bool, region?: String, priority_class: String",
    "Volume": "name: String, size_bytes: Long, storage_class?: String, shared: Bool",
    "VolumeAttachment": "volume_id: String, allocation_id: String, mode: String",
    "PowerAction": "allocation_id: String, action: String",
    "Job": "name: String, cluster_id: String, cluster_kind: String, tasks: Long, gpus_per_task: Long, gpus: Long, "
           "time_limit_s: Long, privileged: Bool, image?: String",
    "Target": "method: String, path: String",
}
OPERATION_RESOURCE = {"createAllocation": "Allocation", "createVolume": "Volume", "attachVolume": "VolumeAttachment",
                      "requestPowerAction": "PowerAction", "submitJob": "Job"}


class PolicyInvalid(ValueError):
    """The text is not one valid Cedar policy of this schema (``str()``: the parser's or validator's message)."""


@dataclass(frozen=True)
class Operation:
    """A mutating operation of the API, as the schema names it: its operationId, resource type and group."""

    operation_id: str
    group: str
    resource_type: str = "Target"


def operation(operation_id: str, group: str) -> Operation:
    return Operation(operation_id, group, OPERATION_RESOURCE.get(operation_id, "Target"))


def schema_text(operations: Iterable[Operation]) -> str:
    """The Cedar schema (namespace Tessera): users in roles and tenants, one action per mutating operation (in
    its group, in ``mutate``), the resource types."""
    ops = sorted(operations, key=lambda o: o.operation_id)
    lines = [f"namespace {NAMESPACE} {{", "  entity Role;", "  entity Tenant;",
             "  entity User in [Role, Tenant] { role: String, tenant: String };"]
    for name, attrs in RESOURCE_ATTRIBUTES.items():
        lines.append(f"  entity {name} {{ operation: String, tenant: String, {attrs} }} tags String;")
    lines.append(f'  action "{MUTATE}";')
    for group in sorted({o.group for o in ops} - {o.operation_id for o in ops} - {MUTATE}):
        lines.append(f'  action "{group}" in ["{MUTATE}"];')
    for o in ops:
        lines.append(f'  action "{o.operation_id}" in ["{o.group}", "{MUTATE}"] appliesTo '
                     f'{{ principal: [User], resource: [{o.resource_type}], context: {{}} }};')
    lines.append("}")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Policy:
    """One policy in force: its id (the stored id, or a default's @id), the layer it belongs to and its parsed
    form (Cedar's JSON policy format)."""

    policy_id: str
    scope: str                              # provider | tenant
    tenant_id: uuid.UUID | None
    cedar: dict = field(hash=False, compare=False)

    @property
    def name(self) -> str:
        """What a denial calls the policy: its ``@id`` annotation, or its id when it has none."""
        return self.cedar.get("annotations", {}).get("id") or self.policy_id

    @property
    def reason(self) -> str:
        return self.cedar.get("annotations", {}).get("reason") or f"policy {self.name} forbids this request"


def parse_one(text: str) -> dict:
    """The one static policy ``text`` holds, in Cedar's JSON form; PolicyInvalid otherwise."""
    if len(text) > MAX_POLICY_CHARS:
        raise PolicyInvalid(f"a policy has at most {MAX_POLICY_CHARS} characters")
    try:
        parsed = json.loads(cedarpy.policies_to_json_str(text))
    except ValueError as exc:
        raise PolicyInvalid(f"not Cedar: {exc}") from None
    static, templates = parsed.get("staticPolicies", {}), parsed.get("templates", {})
    if templates or len(static) != 1:
        raise PolicyInvalid(f"write exactly one static policy (no templates); found {len(static)} "
                            f"polic{'y' if len(static) == 1 else 'ies'} and {len(templates)} template(s)")
    return next(iter(static.values()))


def check(text: str, schema: cedarpy.Schema, *, tenant_id: uuid.UUID | None = None) -> dict:
    """``text`` parsed, when it is one policy that validates against ``schema`` and, for a tenant's policy, names
    no other tenant; PolicyInvalid with the validator's message otherwise."""
    cedar = parse_one(text)
    result = cedarpy.validate_policies(text, schema)
    if not result.validation_passed:
        raise PolicyInvalid("; ".join(e.error for e in result.errors) or "the policy does not validate")
    if tenant_id is not None:
        for id_ in _tenants_named(cedar):
            if id_ != str(tenant_id):
                raise PolicyInvalid(f"a tenant's policy may name only its own tenant, not {id_!r}")
    return cedar


def _tenants_named(node) -> Iterable[str]:
    """Every Tenant entity literal in a policy's JSON form (in its scope or its conditions)."""
    if isinstance(node, dict):
        if node.get("type") == f"{NAMESPACE}::Tenant" and isinstance(node.get("id"), str):
            yield node["id"]
        for value in node.values():
            yield from _tenants_named(value)
    elif isinstance(node, list):
        for value in node:
            yield from _tenants_named(value)


def load_defaults(schema: cedarpy.Schema, text: str | None = None) -> list[Policy]:
    """The default provider policies (policy_defaults.cedar), each keyed by its @id; PolicyInvalid when one does not
    validate (a broken default must stop the gateway, not pass silently)."""
    text = DEFAULTS_FILE.read_text() if text is None else text
    result = cedarpy.validate_policies(text, schema)
    if not result.validation_passed:
        raise PolicyInvalid("; ".join(e.error for e in result.errors))
    parsed = json.loads(cedarpy.policies_to_json_str(text))["staticPolicies"]
    return [Policy(p["annotations"]["id"], "provider", None, p) for p in parsed.values()]


_BASE = parse_one("permit (principal, action, resource);")


@dataclass(frozen=True)
class Caller:
    """Who asks: the principal's id, role and tenant (None: a provider admin)."""

    user_id: uuid.UUID
    role: str
    tenant_id: uuid.UUID | None


@dataclass(frozen=True)
class Resource:
    """What is asked: the operation, its resource type's attributes (without operation/tenant) and its tags."""

    operation_id: str
    resource_type: str
    attrs: dict
    tags: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    allowed: bool
    policy_ids: tuple[str, ...] = ()     # on a denial: the forbid policies that matched
    reason: str | None = None
    errors: tuple[str, ...] = ()         # policies that could not be evaluated (skipped, as Cedar does)
    policy_name: str | None = None       # on a denial: the first one's @id annotation, or its id


def _uid(type_: str, id_: str) -> dict:
    return {"type": f"{NAMESPACE}::{type_}", "id": id_}


def entities(caller: Caller, resource: Resource) -> tuple[dict, list[dict]]:
    """The Cedar request and its entities."""
    tenant = str(caller.tenant_id) if caller.tenant_id else ""
    parents = [_uid("Role", caller.role)] + ([_uid("Tenant", tenant)] if tenant else [])
    user = {"uid": _uid("User", str(caller.user_id)), "attrs": {"role": caller.role, "tenant": tenant},
            "parents": parents}
    target = {"uid": _uid(resource.resource_type, "request"),
              "attrs": {**resource.attrs, "operation": resource.operation_id, "tenant": tenant}, "parents": [],
              "tags": {str(k): str(v) for k, v in resource.tags.items()}}
    roles = [{"uid": _uid("Role", caller.role), "attrs": {}, "parents": []}]
    tenants = [{"uid": _uid("Tenant", tenant), "attrs": {}, "parents": []}] if tenant else []
    request = {"principal": user["uid"], "action": {"type": f"{NAMESPACE}::Action", "id": resource.operation_id},
               "resource": target["uid"], "context": {}}
    return request, [user, target] + roles + tenants


class PolicyBook:
    """The policies in force: the provider's and each tenant's, compiled per layer on first use (immutable: a
    change builds a new book)."""

    def __init__(self, schema: cedarpy.Schema, policies: Iterable[Policy]):
        self.schema = schema
        self.policies = list(policies)
        self._sets: dict[uuid.UUID | None, tuple[cedarpy.PolicySet, dict[str, Policy]]] = {}

    def applicable(self, tenant_id: uuid.UUID | None) -> list[Policy]:
        """The provider's policies and, for a tenant's member, its tenant's (never another tenant's)."""
        return [p for p in self.policies
                if p.scope == "provider" or (tenant_id is not None and p.tenant_id == tenant_id)]

    def _set_for(self, tenant_id: uuid.UUID | None) -> tuple[cedarpy.PolicySet, dict[str, Policy]]:
        if tenant_id not in self._sets:
            chosen = {p.policy_id: p for p in self.applicable(tenant_id)}
            static = {BASE_PERMIT_ID: _BASE, **{pid: p.cedar for pid, p in chosen.items()}}
            doc = json.dumps({"staticPolicies": static, "templates": {}, "templateLinks": []})
            self._sets[tenant_id] = (cedarpy.PolicySet.from_json_str(doc), chosen)
        return self._sets[tenant_id]

    def decide(self, caller: Caller, resource: Resource) -> Decision:
        """Allow, or deny naming the provider or tenant policies that forbid it (provider ones first)."""
        policy_set, chosen = self._set_for(caller.tenant_id)
        request, ents = entities(caller, resource)
        result = cedarpy.is_authorized(request, policy_set, ents, self.schema)
        errors = tuple(str(e) for e in result.diagnostics.errors)
        if result.allowed:
            return Decision(True, errors=errors)
        found = [chosen[r] for r in result.diagnostics.reasons if r in chosen]
        if not found:   # no forbid matched, yet no permit either: the request itself did not fit the schema
            detail = errors[-1].rsplit(": ", 1)[-1][:200] if errors else "no policy permits it"
            return Decision(False, ("tessera.schema",), f"the request does not fit the policy schema: {detail}", errors,
                            "tessera.schema")
        found.sort(key=lambda p: (p.scope != "provider", p.policy_id))
        return Decision(False, tuple(p.policy_id for p in found), found[0].reason, errors, found[0].name)
