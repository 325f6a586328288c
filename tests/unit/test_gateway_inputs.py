"""The gateway's input layer and schema types, checked without I/O: every string of every request body refuses what
PostgreSQL cannot store (and control characters), integers are JSON numbers without fraction, JSON nesting is
bounded, path/query/header values are validated with the type the document shows, and the OpenAPI document states
each of these limits (lengths, sizes, patterns) rather than less."""
from __future__ import annotations

import copy
import ipaddress
import re
import uuid

import pytest
from pydantic import ValidationError

from services.gateway.api.allocations.schemas import AllocationCreate
from services.gateway.api.billing.budget_schemas import BudgetSet, SpendCapSet
from services.gateway.api.billing.usage_schemas import PriceListPut
from services.gateway.api.clusters.schemas import ClusterCreate, ClusterScale
from services.gateway.api.identity.api_key_schemas import ApiKeyCreate, UserPatch
from services.gateway.api.identity.schemas import TenantCreate, TenantPatch, UserCreate
from services.gateway.api.identity.ssh_key_schemas import SshKeyCreate
from services.gateway.api.inventory.bmc_schemas import BmcSet
from services.gateway.api.inventory.health_schemas import DrainRequest, FaultRequest, HealthPolicySet
from services.gateway.api.inventory.image_schemas import ImageCreate
from services.gateway.api.inventory.node_schemas import NodeCreate, NodePatch, SlotMapApproval
from services.gateway.api.inventory.pool_schemas import PoolDefinition
from services.gateway.api.inventory.quota_schemas import TenantQuotaSet, UserQuotaSet
from services.gateway.api.inventory.shape_schemas import ShapeDefinition
from services.gateway.api.jobs.schemas import JobCreate
from services.gateway.api.limits.schemas import RateLimitsSet
from services.gateway.api.networks.schemas import SUBNET_PATTERN, NetworkCreate, RuleCreate, ipv4_network_pattern
from services.gateway.api.policies.schemas import PolicyCreate, PolicyEvaluate, PolicyReplace
from services.gateway.api.spot.schemas import SpotOfferingSet
from services.gateway.api.storage.schemas import AttachmentCreate, StorageQuotaSet, VolumeCreate, VolumeResize
from services.gateway.entrypoints.openapi import ENDPOINTS, document
from services.gateway.http.endpoint import Param
from services.gateway.http.inputs import MAX_JSON_DEPTH, json_depth, parse_value
from services.gateway.http.problems import ProblemError, field_errors
from services.gateway.http.schema_base import MULTI_LINE, Body, integer

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE2ZZdnE/RtlHeGDHHC2CVZeBzgkzYhgCfhP2TXh3PAj ada@example"

# One valid body per request model, naming every field it has.
VALID = {
    DrainRequest: {"mode": "deadline", "deadline": "2030-01-01T00:00:00Z", "reason": "replace the PSU"},
    FaultRequest: {"kind": "xid", "gpu": 1, "code": 79, "value": 1.5, "duration_s": 60.5},
    HealthPolicySet: {"classifications": ["prevent_allocations", "drain"], "note": "fell off the bus"},
    AllocationCreate: {"name": "train-1", "shape": "vm.1gpu", "volume_gb": 10, "labels": {"team": "ml"},
                       "priority_class": "high", "spot": True, "pool": "shared", "tolerations": ["gpu=h100:NoSchedule"],
                       "fail_fast": True, "network_id": str(uuid.uuid4()), "image": "ubuntu-24.04", "ssh_keys": [KEY],
                       "key_names": ["laptop"], "volumes": [{"volume_id": str(uuid.uuid4()), "mode": "ro"}],
                       "scratch_class": "standard"},
    NetworkCreate: {"name": "web", "cidr": "10.1.0.0/24"},
    RuleCreate: {"direction": "egress", "protocol": "tcp", "port_from": 80, "port_to": 443,
                 "remote_network_id": str(uuid.uuid4()), "remote_cidr": "203.0.113.0/24"},
    NodeCreate: {"name": "node-1", "gpu_model": "H100", "gpu_count": 8, "labels": {"hw": "hgx"}, "pool": "shared",
                 "region": "eu-1", "site": "fra-1", "rack": "r12"},
    SlotMapApproval: {"proposal": 3, "wipe_policy": "nvme-format"},
    NodePatch: {"pool": "shared", "labels": {"hw": "hgx"}, "taints": {"gpu": "h100:NoSchedule"}, "cordoned": True,
                "reason": "maintenance"},
    PoolDefinition: {"policy": "spread", "taints": {"gpu": "h100:NoSchedule"}, "description": "the H100 pool"},
    ShapeDefinition: {"kind": "mig", "gpu_count": 1, "gpu_model": "H100", "mig_profile": "1g.10gb"},
    TenantQuotaSet: {"limit": 8, "guaranteed": 4},
    UserQuotaSet: {"limit": 4},
    TenantCreate: {"name": "Acme Corp", "weight": 2},
    TenantPatch: {"weight": 3},
    UserCreate: {"name": "ada@acme", "role": "tenant_user"},
    ImageCreate: {"name": "ubuntu-24.04", "os": "Ubuntu 24.04", "format": "qcow2", "source": "/images/u.qcow2",
                  "sha256": "0" * 64, "min_disk_gb": 10, "visibility": "private", "tenant_id": str(uuid.uuid4()),
                  "kernel": "/boot/vmlinuz", "initrd": "/boot/initrd.img", "kernel_args": "console=ttyS0",
                  "default": False},
    SshKeyCreate: {"name": "laptop", "public_key": KEY},
    VolumeCreate: {"name": "datasets", "storage_class": "standard", "size_bytes": 1 << 30, "shared": True},
    PriceListPut: {"currency": "USD", "effective_from": "2030-01-01T00:00:00Z", "spot_discount_bps": 3000,
                   "gpu_prices": [{"micros_per_gpu_hour": 2_500_000, "gpu_model": "H100", "pool": "shared"}],
                   "storage_prices": {"standard": 100}},
    VolumeResize: {"size_bytes": 1 << 31},
    AttachmentCreate: {"allocation_id": str(uuid.uuid4()), "mode": "ro"},
    StorageQuotaSet: {"max_bytes": 1 << 40, "max_volumes": 10},
    BudgetSet: {"amount_minor": 100_000, "currency": "USD", "thresholds": [{"percent": 80, "basis": "forecast"}],
                "webhook_url": "https://hooks.example.com/tessera?team=ml", "webhook_secret": "signing-key-0123456789"},
    SpendCapSet: {"amount_minor": 500_000, "currency": "EUR"},
    ApiKeyCreate: {"name": "ci runner", "expires_in_s": 86400},
    UserPatch: {"disabled": True},
    PolicyCreate: {"scope": "tenant", "tenant_id": str(uuid.uuid4()), "name": "two-gpus", "description": "at most 2",
                   "text": '@reason("at most 2 GPUs")\nforbid (principal, action, resource is Tessera::Allocation)\n'
                           'when { resource.gpu_count > 2 };', "enabled": True},
    PolicyReplace: {"name": "two-gpus", "description": "at most 2", "enabled": False,
                    "text": "forbid (principal, action, resource is Tessera::Allocation)\nwhen { resource.spot };"},
    PolicyEvaluate: {"operation": "createAllocation", "role": "tenant_user", "tenant_id": str(uuid.uuid4()),
                     "resource": {"shape": "vm.8gpu", "spot": False}, "tags": {"team": "ml"},
                     "candidate": "forbid (principal, action, resource);"},
    RateLimitsSet: {"read_per_s": 50, "read_burst": 100, "write_per_s": 10, "write_burst": 20, "user_read_per_s": 20,
                    "user_read_burst": 40, "user_write_per_s": 5, "user_write_burst": 10, "sse_connections": 8},
    BmcSet: {"url": "https://10.0.0.5", "system_id": "/redfish/v1/Systems/1", "username": "root", "password": "calvin",
             "verify_tls": True, "ca_bundle": "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmg\n-----END CERTIFICATE-----\n"},
    # shape and nodes, or allocation_ids: a null stands for the other form's field
    SpotOfferingSet: {"tenant_id": "7d3e3a52-0c55-4f0f-8a0e-4f1b7b1c5e11", "shape": "vm.8gpu", "max_nodes": 4,
                      "headroom_gpus": 8, "notice_s": 30, "tolerations": ["dedicated=spot:NoSchedule"],
                      "cluster_name": "tessera-spot", "group": "tessera", "region": "local"},
    ClusterCreate: {"name": "train", "kind": "slurm", "shape": "vm.8gpu", "nodes": 2, "allocation_ids": None,
                    "network_id": str(uuid.uuid4()),
                    "pool": "shared", "tolerations": ["gpu=h100:NoSchedule"], "priority": 10,
                    "autoscaling": {"min_nodes": 1, "max_nodes": 4, "target_gpu_util": 0.8, "cooldown_s": 60}},
    ClusterScale: {"nodes": 3},
    # command and entrypoint exclude each other: an empty command stands for the field
    JobCreate: {"cluster_id": str(uuid.uuid4()), "name": "fit-1", "command": [], "entrypoint": "python train.py",
                "tasks": 2, "gpus_per_task": 1, "time_limit_s": 600, "env": {"EPOCHS": "3"}, "image": "nvcr.io/x:1",
                "privileged": False},
}
MULTI_LINE_FIELDS = {(JobCreate, "entrypoint"), (JobCreate, "env"), (JobCreate, "command"),
                     (NodePatch, "reason"), (PoolDefinition, "description"), (PolicyCreate, "text"),
                     (PolicyReplace, "text"), (PolicyEvaluate, "candidate"), (DrainRequest, "reason"),
                     (HealthPolicySet, "note")}
REFUSED = ["\x00", "\x01", "\x1b", "\x1f", "\x7f", "\x85", "\x9f", "\ud800", "\udfff"]


def _leaves(value, path=()):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaves(v, (*path, i))
    else:
        yield path, value


def _replaced(body: dict, path: tuple, value) -> dict:
    out = copy.deepcopy(body)
    target = out
    for p in path[:-1]:
        target = target[p]
    target[path[-1]] = value
    return out


def _with_key(body: dict, path: tuple, old: str, new: str) -> dict:
    out = copy.deepcopy(body)
    target = out
    for p in path:
        target = target[p]
    target[new] = target.pop(old)
    return out


def _fields(model: type[Body], body: dict) -> set[str]:
    with pytest.raises(ValidationError) as err:
        model.model_validate(body)
    return {e.field for e in field_errors(err.value)}


def _request_models() -> set[type[Body]]:
    return {e.body for e in ENDPOINTS if e.body is not None}


def test_the_examples_are_valid_and_name_every_field_of_every_request_model():
    assert set(VALID) == _request_models()
    for model, body in VALID.items():
        model.model_validate(body)
        assert set(body) == set(model.model_fields), model


@pytest.mark.parametrize("model", [m for m in VALID if any(isinstance(v, str) for _, v in _leaves(VALID[m]))],
                         ids=lambda m: m.__name__)
def test_every_string_value_refuses_nul_control_characters_and_lone_surrogates_naming_the_field(model):
    body = VALID[model]
    for path, value in [(path, v) for path, v in _leaves(body) if isinstance(v, str)]:
        field = ".".join(str(p) for p in path)
        for bad in REFUSED:
            assert field in _fields(model, _replaced(body, path, value[:1] + bad + value[1:])), (field, repr(bad))
        if (model, path[0]) in MULTI_LINE_FIELDS:
            model.model_validate(_replaced(body, path, "line one\r\n\tline two"))
        else:
            assert field in _fields(model, _replaced(body, path, value + "\n")), field


@pytest.mark.parametrize("model", [m for m in VALID if any(isinstance(v, dict) for v in VALID[m].values())],
                         ids=lambda m: m.__name__)
def test_every_dict_key_refuses_nul_and_control_characters_naming_the_field(model):
    body = VALID[model]
    for name, value in body.items():
        if not isinstance(value, dict):
            continue
        for key in value:
            for bad in REFUSED:
                fields = _fields(model, _with_key(body, (name,), key, key + bad))
                # a nested object's own field names are no keys: pydantic refuses a lone surrogate in one whole
                nested = bad in ("\ud800", "\udfff") and isinstance(getattr(model.model_validate(body), name), Body)
                assert any(f.startswith(f"{name}.") or (nested and f == name) for f in fields), (name, repr(bad),
                                                                                                fields)
                assert all(c.isprintable() for f in fields for c in f), fields   # echoed escaped


@pytest.mark.parametrize("model", list(VALID), ids=lambda m: m.__name__)
def test_every_integer_is_a_json_number_without_fraction(model):
    body = VALID[model]
    ints = [(path, v) for path, v in _leaves(body) if isinstance(v, int) and not isinstance(v, bool)]
    for path, value in ints:
        field = ".".join(str(p) for p in path)
        parsed = model.model_validate(_replaced(body, path, float(value)))
        got = parsed
        for step in path:   # down to the leaf, through nested models, lists and dicts
            got = got[step] if isinstance(got, (list, dict)) else getattr(got, step)
        assert got == value and isinstance(got, int), (field, got)
        for bad in (value + 0.5, str(value), True, None if model is not SlotMapApproval else "x"):
            if bad is None:
                continue
            assert field in _fields(model, _replaced(body, path, bad)), (field, bad)


def test_cross_field_rules_are_refused_naming_the_field():
    assert _fields(TenantQuotaSet, {"limit": 2, "guaranteed": 3}) == {"guaranteed"}
    assert _fields(NodePatch, {"reason": "only a reason"}) == {"body"}
    for name in ("pool", "labels", "taints", "cordoned", "reason"):
        assert _fields(NodePatch, {"cordoned": True, name: None}) == {name}, name


def test_a_uuid_in_a_body_is_written_as_json_schema_says():
    body = VALID[AllocationCreate]
    ident = uuid.uuid4()
    for form in (ident.hex, f"{{{ident}}}", f"urn:uuid:{ident}", str(ident) + "\n"):
        assert _fields(AllocationCreate, {**body, "network_id": form}) == {"network_id"}, form
    assert AllocationCreate.model_validate({**body, "network_id": str(ident).upper()}).network_id == ident


def test_json_depth_counts_nesting_outside_strings_only():
    assert json_depth(b'{"a": 1}') == 1
    assert json_depth(b'{"a": [[{"b": []}]]}') == 5
    assert json_depth(b'{"a": "[[[[{{{{", "b": "\\"[["}') == 1
    assert json_depth(b"[" * 5000 + b"]" * 5000) == 5000
    assert json_depth(b"") == json_depth(b"42") == 0
    assert MAX_JSON_DEPTH >= 8   # deeper than any body of the API


def test_the_cidr_patterns_agree_with_the_network_services_rule():
    from services.network.contracts import UNUSABLE_PATTERN, cidr_problem
    samples = [f"{a}.{b}.{c}.{d}/{p}" for a in (0, 10, 127, 169, 223, 224, 239, 240, 255) for b in (0, 1, 128, 254)
               for c in (0, 3, 128, 255) for d in (0, 8, 129) for p in (0, 8, 15, 16, 17, 23, 24, 25, 29, 30, 32)]
    for text in samples + ["10.1.0.0/24", "010.1.0.0/24", "10.1.0.0/024", "10.1.0.0", "10.1.0.0/24 ", ""]:
        documented = bool(re.fullmatch(SUBNET_PATTERN, text)) and not re.search(UNUSABLE_PATTERN, text)
        assert documented == (cidr_problem(text) is None and text.strip() == text
                                                           and "/0" not in text and not re.search(r"(^|\.)0\d", text)), text
    assert re.fullmatch(ipv4_network_pattern(0, 32), "0.0.0.0/0") and re.fullmatch(ipv4_network_pattern(0, 32), "1.2.3.4/32")
    assert not re.fullmatch(ipv4_network_pattern(0, 32), "1.2.3.5/31")


# --- path, query and header values ----------------------------------------------------------------------------

def _problem(param: Param, raw: str) -> ProblemError:
    with pytest.raises(ProblemError) as err:
        parse_value(param, raw)
    assert err.value.status == 422 and [e.field for e in err.value.errors] == [param.name]
    return err.value


def test_every_parameter_refuses_control_characters_and_integer_ones_take_digits_only():
    params = {id(p): p for e in ENDPOINTS for p in e.params}.values()
    for p in params:
        if p.schema.get("format") == "uuid" or p.schema.get("type") == "array":
            continue   # uuids: a malformed one is an unknown resource (404); arrays are read value by value
        for bad in REFUSED:
            _problem(p, "ab" + bad)
    limit = Param("limit", "query", "x", integer(1, 100), default=20)
    assert parse_value(limit, "10") == 10
    for bad in ("", "junk", "10.0", "+10", "1_0", " 10", "١٠", "0", "101", "9" * 40):
        _problem(limit, bad)


# --- the document states the limits ---------------------------------------------------------------------------

_KEYWORDS = {"type", "properties", "required", "additionalProperties", "items", "enum", "const", "anyOf", "allOf",
             "oneOf", "not", "if", "then", "else", "$ref", "title", "description", "default", "examples", "format",
             "pattern", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
             "minItems", "maxItems", "uniqueItems", "minProperties", "maxProperties", "propertyNames",
             "patternProperties", "dependentRequired", "x-constraints"}


def _schemas(node, rules: bool = True):
    """Every (sub)schema under ``node``; ``rules``: also those of conditions (allOf, if/then/else, not), which
    narrow a field's own schema rather than being one."""
    if isinstance(node, dict):
        yield node
        for key, value in node.items():
            if key == "properties":
                for sub in value.values():
                    yield from _schemas(sub, rules)
            elif key in ("items", "additionalProperties", "propertyNames"):
                yield from _schemas(value, rules)
            elif key in ("anyOf", "oneOf"):
                for sub in value:
                    yield from _schemas(sub, rules)
            elif rules and key in ("not", "if", "then", "else"):
                yield from _schemas(value, rules)
            elif rules and key == "allOf":
                for sub in value:
                    yield from _schemas(sub, rules)


def _request_schemas():
    doc = document()
    components = doc["components"]["schemas"]
    for model in _request_models():
        yield model.__name__, components[model.__name__]
    for e in ENDPOINTS:
        for p in e.params:
            yield f"{e.operation_id}:{p.name}", p.schema


def test_every_schema_keyword_is_json_schema():
    doc = document()
    for name, schema in doc["components"]["schemas"].items():
        for sub in _schemas(schema):
            assert set(sub) <= _KEYWORDS, (name, set(sub) - _KEYWORDS)


def test_every_string_the_api_reads_has_a_length_and_a_pattern_refusing_control_characters():
    for name, schema in _request_schemas():
        for sub in _schemas(schema, rules=False):
            if sub.get("type") != "string" or "enum" in sub or "const" in sub or sub.get("format") == "uuid":
                continue
            assert "maxLength" in sub and "pattern" in sub, (name, sub)
            # (fullmatch: ECMA-262's "$" is the end of the input, Python's search would also match before a last "\n")
            for bad in REFUSED[:7]:
                assert not re.fullmatch(sub["pattern"], "ab" + bad), (name, sub["pattern"], repr(bad))
            assert sub["pattern"] == MULTI_LINE or not re.fullmatch(sub["pattern"], "a\n"), (name, sub)


def test_every_list_and_dict_the_api_reads_has_a_size_and_dict_keys_their_whole_rule():
    for name, schema in _request_schemas():
        for sub in _schemas(schema, rules=False):
            if sub.get("type") == "array":
                assert "maxItems" in sub, (name, sub)
            if sub.get("type") == "object" and "properties" not in sub:
                assert "maxProperties" in sub and "patternProperties" not in sub, (name, sub)
                assert {"pattern", "maxLength"} <= set(sub["propertyNames"]), (name, sub)


def test_a_field_the_server_refuses_as_null_is_not_nullable_in_the_document():
    schema = document()["components"]["schemas"]["NodePatch"]
    for name, prop in schema["properties"].items():
        assert {"type": "null"} not in prop.get("anyOf", []) and "default" not in prop, name
    assert schema["anyOf"] == [{"required": [f]} for f in ("pool", "labels", "taints", "cordoned")]


def test_problems_with_extension_members_are_documented_where_they_are_answered():
    paths = document()["paths"]
    approve = paths["/v1/nodes/{node_id}/approve"]["post"]["responses"]["409"]["content"]["application/problem+json"]
    assert approve["schema"] == {"$ref": "#/components/schemas/ProposalProblem"}
    create = paths["/v1/allocations"]["post"]["responses"]["403"]["content"]["application/problem+json"]["schema"]
    assert {"$ref": "#/components/schemas/QuotaProblem"} in create["anyOf"]
    proposal = document()["components"]["schemas"]["ProposalProblem"]
    assert {"current_proposal", "node_status"} <= set(proposal["required"]) and "enum" in proposal["properties"]["node_status"]


def test_a_budget_webhook_is_http_or_https_without_credentials_and_its_secret_printable_16_to_256():
    body = VALID[BudgetSet]
    for url in ("https://hooks.example.com", "http://10.0.0.5:8080/hook#x", "https://[2001:db8::1]/a@b"):
        BudgetSet.model_validate({**body, "webhook_url": url})
    for url in ("ftp://hooks.example.com", "https://user:pw@hooks.example.com/", "https://token@example.com",
                "https://", "https://exa mple.com", "hooks.example.com", "HTTPS://example.com", "https://example.com:port/",
                "https://example.com/" + "a" * 2030):
        assert _fields(BudgetSet, {**body, "webhook_url": url}) == {"webhook_url"}, url
    for secret in ("x" * 15, "x" * 257, "tab\there-0123456789", "é" * 20):
        assert _fields(BudgetSet, {**body, "webhook_secret": secret}) == {"webhook_secret"}, secret
    assert _fields(BudgetSet, {**body, "thresholds": []}) == {"thresholds"}
    assert _fields(BudgetSet, {**body, "thresholds": [{"percent": 1001}]}) == {"thresholds.0.percent"}
    assert _fields(SpendCapSet, {"amount_minor": -1, "currency": "EUR"}) == {"amount_minor"}


@pytest.mark.parametrize("cidr", ["230.165.236.64/27", "240.0.0.0/16", "255.122.0.0/17", "255.255.255.248/29",
                                  "127.0.0.0/16", "169.254.0.0/16", "0.0.0.0/16", "224.0.0.0/24"])
def test_a_subnet_no_host_can_use_is_refused_by_both_the_network_service_and_the_document(cidr):
    from services.network.contracts import UNUSABLE_PATTERN, cidr_problem
    assert "no host can use it" in cidr_problem(cidr)
    assert re.search(UNUSABLE_PATTERN, cidr)
    schema = NetworkCreate.model_json_schema()["properties"]["cidr"]
    assert schema["not"] == {"pattern": UNUSABLE_PATTERN}
    with pytest.raises(ValidationError) as err:
        NetworkCreate.model_validate({"name": "n", "cidr": cidr})
    assert err.value.errors()[0]["loc"] == ("cidr",)


def test_only_private_ranges_are_private():
    from services.network.contracts import is_private
    for cidr in ("10.0.0.0/16", "172.31.255.0/24", "192.168.7.0/24", "100.64.0.0/16", "100.127.255.0/24"):
        assert is_private(ipaddress.IPv4Network(cidr)), cidr
    for cidr in ("8.8.8.0/24", "172.32.0.0/16", "100.128.0.0/16", "192.169.0.0/16", "203.0.113.0/24"):
        assert not is_private(ipaddress.IPv4Network(cidr)), cidr
