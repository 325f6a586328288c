"""The rules the gateway applies to a request body, as its OpenAPI document states them: in the body's schema where
JSON Schema can say them, else in the operation's description ("Rules the schema cannot state: …"). A client (or a
fuzzer) that follows the document must not be refused for a rule it could not read."""
from __future__ import annotations

import uuid

import pytest
from jsonschema import Draft202012Validator
from pydantic import ValidationError

from services.gateway.api.policies.schemas import PolicyCreate
from services.gateway.api.storage.schemas import VolumeResize
from services.gateway.entrypoints.openapi import ENDPOINTS, document
from services.gateway.http.policy_cache import NOT_JUDGED, mutating_endpoints
from services.storage.contracts import MAX_VOLUME_BYTES, MIN_VOLUME_BYTES

UNSTATED = "Rules the schema cannot state"


def _operation(method: str, path: str) -> dict:
    return document()["paths"][path][method]


def _body(method: str, path: str) -> dict:
    ref = _operation(method, path)["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    return document()["components"]["schemas"][ref.rsplit("/", 1)[1]]


def _valid(name: str, body: dict) -> bool:
    """Whether ``body`` is valid by the document's schema ``name`` (its $refs resolved within the document)."""
    wrapper = {"$ref": f"#/components/schemas/{name}", "components": document()["components"]}
    return Draft202012Validator(wrapper).is_valid(body)


def _names_rules(method: str, path: str, *phrases: str) -> None:
    description = _operation(method, path)["description"]
    assert UNSTATED in description, (method, path)
    unstated = description.split(UNSTATED, 1)[1]
    for phrase in phrases:
        assert phrase in unstated, (method, path, phrase)


# --- POST /v1/volumes and PATCH /v1/volumes/{volume_id} --------------------------------------------------------

def test_create_volume_names_the_rules_of_the_offer_and_the_tenant():
    schema = _body("post", "/v1/volumes")["properties"]
    assert (schema["size_bytes"]["minimum"], schema["size_bytes"]["maximum"]) == (MIN_VOLUME_BYTES, MAX_VOLUME_BYTES)
    _names_rules("post", "/v1/volumes", "`storage_class` is a class GET /v1/storage-classes lists",
                 "the default class must be offered", "at most that class's `max_volume_bytes`",
                 "not used by a live volume of the tenant (a 409)", "storage quota")


def test_a_resize_is_above_the_smallest_volume_in_the_schema_and_the_model():
    size = _body("patch", "/v1/volumes/{volume_id}")["properties"]["size_bytes"]
    assert size["exclusiveMinimum"] == MIN_VOLUME_BYTES and "minimum" not in size
    assert size["maximum"] == MAX_VOLUME_BYTES
    assert not _valid("VolumeResize", {"size_bytes": MIN_VOLUME_BYTES})
    assert _valid("VolumeResize", {"size_bytes": MIN_VOLUME_BYTES + 1})
    with pytest.raises(ValidationError):   # every volume holds 1 MiB at least: that size never grows one
        VolumeResize.model_validate({"size_bytes": MIN_VOLUME_BYTES})
    _names_rules("patch", "/v1/volumes/{volume_id}", "larger than the volume's current size",
                 "at most the volume's class's `max_volume_bytes`", "storage quota")


# --- POST /v1/policies and POST /v1/policies/evaluate ----------------------------------------------------------

def test_a_provider_policy_names_no_tenant_in_the_schema():
    schema = _body("post", "/v1/policies")
    assert schema["if"] == {"properties": {"scope": {"const": "provider"}}, "required": ["scope"]}
    assert schema["then"] == {"properties": {"tenant_id": {"type": "null"}}}
    policy = {"name": "p", "text": "permit (principal, action, resource);"}
    tenant = str(uuid.uuid4())
    assert not _valid("PolicyCreate", {**policy, "scope": "provider", "tenant_id": tenant})
    assert _valid("PolicyCreate", {**policy, "scope": "provider", "tenant_id": None})
    assert _valid("PolicyCreate", {**policy, "scope": "provider"})
    assert _valid("PolicyCreate", {**policy, "scope": "tenant", "tenant_id": tenant})
    assert _valid("PolicyCreate", {**policy, "scope": "tenant"})      # a tenant admin's: its own tenant
    PolicyCreate.model_validate({**policy, "scope": "provider", "tenant_id": tenant})   # the handler refuses it


def test_create_policy_names_the_rules_of_cedar_and_of_the_caller():
    _names_rules("post", "/v1/policies", "exactly one static Cedar policy that validates against the policy schema",
                 "names no other tenant", "names its tenant in `tenant_id` when a provider admin writes it",
                 "a tenant that exists", "its own tenant's policies only")


def test_evaluate_policy_names_the_operations_the_policies_judge():
    _names_rules("post", "/v1/policies/evaluate", "`operation` is one the policies judge",
                 "every POST, PUT, PATCH and DELETE operation", *sorted(NOT_JUDGED),
                 "`candidate` is exactly one static Cedar policy", "`tenant_id` is its own tenant")
    # what the description says is exactly the set the handler checks (the route table's, not a constant)
    described = {op["operationId"] for item in document()["paths"].values() for method, op in item.items()
                 if method in ("post", "put", "patch", "delete")} - NOT_JUDGED
    assert described == set(mutating_endpoints(ENDPOINTS))


# --- POST /v1/allocations ----------------------------------------------------------------------------------------

def test_an_allocation_names_each_volume_once_in_the_schema():
    assert _body("post", "/v1/allocations")["properties"]["volumes"]["uniqueItems"] is True
    volume = {"volume_id": str(uuid.uuid4())}
    assert not _valid("AllocationCreate", {"name": "a", "shape": "vm.1gpu", "volumes": [volume, volume]})
    assert _valid("AllocationCreate", {"name": "a", "shape": "vm.1gpu",
                                       "volumes": [volume, {"volume_id": str(uuid.uuid4())}]})


def test_create_allocation_names_the_rules_of_the_catalog_and_the_caller():
    _names_rules("post", "/v1/allocations", "`shape` is one GET /v1/shapes lists",
                 "`image` is the name or id of an image GET /v1/images lists", "`key_names` is a key the caller stored",
                 "add up to at most 32 distinct keys", "a volume of the tenant that can be mounted now",
                 "is named once", "`scratch_class` is a class GET /v1/storage-classes lists",
                 "Idempotency-Key already used comes with the same body")


# --- POST /v1/networks/{network_id}/rules ------------------------------------------------------------------------

def test_a_rule_states_its_shape_and_names_what_it_cannot():
    schema = _body("post", "/v1/networks/{network_id}/rules")
    assert schema["x-constraints"] == ["port_from <= port_to"]
    ingress, ported, ranged = schema["allOf"]
    assert ingress["then"]["required"] == ["remote_network_id"] and ingress["else"]["required"] == ["remote_cidr"]
    assert ported["if"]["properties"]["protocol"] == {"not": {"enum": ["tcp", "udp"]}}
    assert ranged["then"]["required"] == ["port_from"]
    assert not _valid("RuleCreate", {"direction": "ingress", "remote_cidr": "10.0.0.0/8"})
    assert not _valid("RuleCreate", {"direction": "egress", "protocol": "icmp", "port_from": 1,
                                     "remote_cidr": "10.0.0.0/8"})
    assert not _valid("RuleCreate", {"direction": "egress", "port_to": 80, "remote_cidr": "10.0.0.0/8"})
    _names_rules("post", "/v1/networks/{network_id}/rules", "`port_to` is not below `port_from`",
                 "`remote_network_id` is another network of the tenant", "not this one")
