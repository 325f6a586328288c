"""HTTP models of policies (Cedar, docs/policies.md): stored provider and tenant policies, their versions, and what
a request would get (POST /v1/policies/evaluate)."""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, PlainValidator, WithJsonSchema
from pydantic_core import PydanticCustomError

from ...domain.policy import MAX_POLICY_CHARS
from ...http.schema_base import SINGLE_LINE, Body, LabelKey, Labels, Out, Text, Uuid, omittable, text

PolicyName = text(63, min_length=1, pattern=r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
PolicyText = text(MAX_POLICY_CHARS, min_length=1, multiline=True)
Description = text(500)
OperationId = text(64, min_length=1, pattern=r"^[a-z][A-Za-z0-9]*$")
_LONG = 2 ** 63


def _attribute(value: Any) -> str | bool | int:
    """A Cedar String, Bool or Long (a whole JSON number); one error naming the attribute otherwise (not one per
    member of a union)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        if not -_LONG <= value < _LONG:
            raise PydanticCustomError("long_range", "must fit a 64-bit integer (Cedar Long)")
        return value
    if isinstance(value, str):
        if len(value) > 1024:
            raise PydanticCustomError("string_too_long", "at most 1024 characters")
        return Text().check(value)
    raise PydanticCustomError("attribute_type", "must be a string, a boolean or a whole number")


AttributeValue = Annotated[str | bool | int, PlainValidator(_attribute), WithJsonSchema({"anyOf": [
    {"type": "string", "maxLength": 1024, "pattern": SINGLE_LINE}, {"type": "boolean"},
    {"type": "integer", "minimum": -_LONG, "maximum": _LONG - 1}]})]
Scope = Literal["provider", "tenant"]


# What the handler checks of scope and tenant_id that JSON Schema can say: a provider policy names no tenant (a 422
# on tenant_id). That a tenant policy names its tenant depends on the caller (a tenant admin's defaults to its own),
# so the route's description says it.
_SCOPE_RULES = {"if": {"properties": {"scope": {"const": "provider"}}, "required": ["scope"]},
                "then": {"properties": {"tenant_id": {"type": "null"}}}}


class PolicyCreate(Body):
    model_config = ConfigDict(json_schema_extra=_SCOPE_RULES)
    scope: Scope = Field(description="provider: applies to every tenant (provider admins only); tenant: applies to "
                                     "the tenant's members only.")
    tenant_id: Uuid | None = Field(default=None, description="The tenant of a tenant policy (a tenant admin's own "
                                                             "by default); none for a provider policy.")
    name: PolicyName
    description: Description = ""
    text: PolicyText = Field(description="Exactly one Cedar policy, valid against the schema (docs/policies.md); "
                                         "the @reason annotation is the reason a denial gives.")
    enabled: bool = True


class PolicyReplace(Body):
    name: PolicyName
    description: Description = ""
    text: PolicyText
    enabled: bool = True


class PolicyOut(Out):
    id: str = Field(description="The stored policy's id (a default's @id for the built-in ones): what a denial names.")
    scope: Scope
    tenant_id: uuid.UUID | None
    name: str
    description: str
    text: str
    enabled: bool
    builtin: bool = Field(description="A default provider policy shipped with Tessera: read-only.")
    version: int
    created_by: uuid.UUID | None
    updated_by: uuid.UUID | None
    created_at: datetime | None
    updated_at: datetime | None


class PolicyList(Out):
    items: list[PolicyOut]


class PolicyVersionOut(Out):
    version: int
    name: str
    description: str
    text: str
    enabled: bool
    deleted: bool
    by: uuid.UUID
    at: datetime


class PolicyVersions(Out):
    policy_id: uuid.UUID
    items: list[PolicyVersionOut]


class PolicyEvaluate(Body):
    operation: OperationId = Field(description="The operationId asked about (a mutating one: createAllocation, "
                                               "createVolume, …).")
    role: Literal["tenant_admin", "tenant_user"] = "tenant_user"
    tenant_id: Uuid | None = Field(default=None, description="The caller's tenant (a tenant admin: its own, the "
                                                             "default).")
    resource: dict[LabelKey, AttributeValue] = Field(default_factory=dict, max_length=32,
                                                     description="The resource's attributes, as the schema names "
                                                                 "them (operation and tenant are set by Tessera).")
    tags: Labels = Field(default_factory=dict, description="The resource's tags (an allocation's labels; path "
                                                           "parameters and scalar body fields for the others).")
    candidate: PolicyText = omittable(description="A policy to try as if enabled in the caller's layer (tenant "
                                                  "admins: their tenant; provider admins: the provider's).")


class PolicyDecision(Out):
    allowed: bool
    policy_ids: list[str] = Field(description="On a denial: the forbidding policies, provider ones first "
                                              "(`candidate`: the candidate policy).")
    reason: str | None
    errors: list[str]
