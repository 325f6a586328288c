"""The gateway's HTTP contract, checked without I/O: OpenAPI document, tokens, config, validation errors."""
from __future__ import annotations

import json
import time
import uuid

import pytest
from pydantic import ValidationError

from services.gateway.api.allocations.schemas import AllocationCreate
from services.gateway.api.identity.schemas import TenantCreate, UserCreate
from services.gateway.api.inventory.node_schemas import NodeCreate
from services.gateway.domain.model import Principal
from services.gateway.entrypoints.openapi import ENDPOINTS, document
from services.gateway.http.auth import TokenIssuer
from services.gateway.http.problems import ProblemError, field_errors
from services.gateway.http.schema_base import Body
from services.gateway.settings import GatewaySettings
from shared.settings import SettingError, load

SECRET = "unit-test-secret-" + "u" * 32


def _refs(node):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref":
                yield v
            else:
                yield from _refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _refs(v)


def test_openapi_documents_every_route_once_with_resolvable_refs():
    doc = document()
    ops = [(m.upper(), p) for p, item in doc["paths"].items() for m in item]
    assert sorted(ops) == sorted((e.method, e.path) for e in ENDPOINTS)
    assert len({e.operation_id for e in ENDPOINTS}) == len(ENDPOINTS)
    schemas = doc["components"]["schemas"]
    for ref in _refs(doc):
        assert ref.startswith("#/components/schemas/") and ref.rsplit("/", 1)[1] in schemas, ref
    json.dumps(doc)  # serialisable as is


def test_openapi_errors_are_problem_documents_and_request_bodies_forbid_unknown_fields():
    doc = document()
    for path, item in doc["paths"].items():
        for method, op in item.items():
            for status, resp in op["responses"].items():
                if int(status) >= 400:
                    assert list(resp["content"]) == ["application/problem+json"], (method, path, status)
            if "requestBody" in op:
                name = op["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
                assert doc["components"]["schemas"][name]["additionalProperties"] is False
    assert doc["paths"]["/v1/auth/token"]["post"]["security"] == [{"apiKey": []}]
    assert doc["paths"]["/v1/allocations"]["get"]["security"] == [{"bearerAuth": []}]


@pytest.mark.parametrize("model", [AllocationCreate, NodeCreate, TenantCreate, UserCreate])
def test_server_owned_fields_are_never_client_fields(model: type[Body]):
    assert not model.server_owned & set(model.model_fields)
    assert {"id"} <= model.server_owned


def test_token_round_trips_and_expired_or_foreign_tokens_are_401():
    issuer = TokenIssuer(SECRET, 60)
    p = Principal(uuid.uuid4(), uuid.uuid4(), "tenant_user")
    assert issuer.verify(issuer.issue(p)) == p
    admin = Principal(uuid.uuid4(), None, "provider_admin")
    assert issuer.verify(issuer.issue(admin)) == admin
    for token in (issuer.issue(p, now=time.time() - 120), TokenIssuer("x" * 40, 60).issue(p), "abc", ""):
        with pytest.raises(ProblemError) as err:
            issuer.verify(token)
        assert err.value.status == 401


def test_config_needs_a_long_secret_and_a_positive_ttl():
    with pytest.raises(SettingError):
        load(GatewaySettings, {})
    with pytest.raises(SettingError):
        load(GatewaySettings, {"TESSERA_TOKEN_SECRET": "short"})
    with pytest.raises(SettingError):
        GatewaySettings(token_secret=SECRET, token_ttl_s=0)
    with pytest.raises(SettingError):
        load(GatewaySettings, {"TESSERA_TOKEN_SECRET": SECRET, "TESSERA_TOKEN_TTL_S": "soon"})
    cfg = load(GatewaySettings, {"TESSERA_TOKEN_SECRET": SECRET, "TESSERA_TOKEN_TTL_S": "120",
                                 "TESSERA_BOOTSTRAP_ADMIN_KEY": "tsk_boot"})
    assert (cfg.token_ttl_s, cfg.bootstrap_admin_key) == (120, "tsk_boot")
    assert load(GatewaySettings, {"TESSERA_TOKEN_SECRET": SECRET}).token_ttl_s == 900


def test_validation_errors_name_each_field_with_dotted_paths():
    with pytest.raises(ValidationError) as err:
        AllocationCreate.model_validate({"name": "ok", "shape": "VM 9", "labels": {"team": 1}, "x": 1})
    fields = {e.field: e.code for e in field_errors(err.value)}
    # a well-formed but unknown shape passes the body model: it is checked against the shapes view (a 422 too)
    assert fields == {"shape": "string_pattern_mismatch", "labels.team": "string_type", "x": "extra_forbidden"}


def test_allocation_body_defaults_and_limits():
    a = AllocationCreate.model_validate({"name": "train-1", "shape": "bm.8gpu"})
    assert a.volume_gb == 0 and a.labels == {}
    ok_labels = {f"k{i}": "v" for i in range(32)}
    assert AllocationCreate.model_validate({"name": "a", "shape": "vm.1gpu", "labels": ok_labels}).labels == ok_labels
    with pytest.raises(ValidationError):
        AllocationCreate.model_validate({"name": "a", "shape": "vm.1gpu", "labels": {**ok_labels, "k32": "v"}})
    with pytest.raises(ValidationError):
        AllocationCreate.model_validate({"name": "a", "shape": "vm.1gpu", "volume_gb": 1.5})
