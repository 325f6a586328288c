"""Schemathesis against the live gateway (real NATS and PostgreSQL): every operation of the served /openapi.json, its
coverage cases (boundaries, missing and duplicated parameters, wrong types, unexpected methods) and seeded, derandomized
fuzzing with valid and invalid data, every answer checked against the document: no server error, the documented
status codes, content types, headers and schemas, invalid data refused, valid data accepted.

What the fuzzer is told beyond the document (and why that is not a weaker check):
  * credentials: a provider admin for the provider's operations, a tenant admin for the tenant's (security schemes
    are not generated: the server would only answer 401, which tests nothing); then three more runs call every
    operation as a provider admin, a tenant admin and a tenant user (fewer examples each): a role an operation is
    not for must be refused as the document says (403 or 404), and one it is for must work;
  * the rules JSON Schema cannot state, mended in a valid body: a tenant that exists, a price list that takes
    effect in the future with one price per selector set (a shape price names no model or pool), a tenant policy
    that names its tenant (a provider admin's must, a tenant admin's need not: the caller decides), a private
    subnet for a network (a public one is a documented 422 where the provider allows none);
  * the live state a valid request refers to, as a client would know it (Schemathesis' "seed known data"): ids of
    things that exist (for half of the valid requests; the others keep their random ids and get 404s), the shape
    names GET /v1/shapes lists (an unknown shape is a documented 422), the storage class GET /v1/storage-classes
    lists (an unknown one is a documented 422; the world's class takes the largest volume the document allows and
    its default quota the largest share; the world's volume is the smallest one, so every size the document allows
    it grows it), and an Idempotency-Key that is fresh (a key reused with another body is a documented 422);
  * the document's ``x-constraints`` (comparisons between two fields, which JSON Schema cannot state, e.g.
    ``guaranteed <= limit``): a valid body that breaks one is mended by swapping the two values;
  * that 413 refuses invalid data too: a field longer than its maxLength, generated from characters JSON escapes
    as six bytes each, can make a body larger than the gateway reads (64 KiB), refused as the documented 413 before
    its fields are read.
Left out: the three server-sent-event operations (streamAllocationEvents, streamOpsEvents, streamEvents). Their 200
is an endless text/event-stream, so a valid request never completes and no check can read its answer; their refusals
are tested in test_gateway_allocations.py, test_gateway_ops.py and test_ui_event_feed.py.
"""
from __future__ import annotations

import asyncio
import itertools
import os
import re
import time
import uuid
import zlib
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import hypothesis
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import FlakyStrategyDefinition, Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.config._checks import NEGATIVE_DATA_REJECTION_EXPECTED_STATUSES
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    ensure_resource_availability,
    negative_data_rejection,
    positive_data_acceptance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
    use_after_free,
)

from services.billing.bootstrap import build as billing_build
from services.gateway.api.storage.schemas import MAX_QUOTA_BYTES, MAX_QUOTA_VOLUMES
from services.storage.contracts import MAX_VOLUME_BYTES, MIN_VOLUME_BYTES
from tests.support.gateway import ADMIN_KEY, project

SEED = 20261123
# valid, and never matching a real request: the provider-admin run stores provider policies, which apply to every
# tenant of the test session's database (a later test must not meet them)
POLICY_TEXT = "forbid (principal, action, resource is Tessera::Allocation) when { resource.gpu_count > 100000 };"
# fuzzed cases per operation and mode (valid, invalid), after the coverage cases; derandomized, so a run is the
# same run: 7 (from 15, then 10) keeps the suite within its half hour as the API grows, TESSERA_FUZZ_EXAMPLES gives more
FUZZ_EXAMPLES = int(os.environ.get("TESSERA_FUZZ_EXAMPLES") or 7)
OTHER_ROLE_EXAMPLES = 2       # the same, for a role the operation is not meant for (answers: 403s and 404s)
OTHER_ROLE_COVERAGE = 8       # and its first coverage cases only: the role's answer does not depend on the body
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance, negative_data_rejection, positive_data_acceptance]
STREAMS = {"streamAllocationEvents", "streamOpsEvents", "streamEvents"}
STATEFUL_CHECKS = [use_after_free, ensure_resource_availability]
STATEFUL_EXAMPLES = 40        # call sequences (of up to 6 linked calls each) per session
STATEFUL_SESSIONS, STATEFUL_CALLS = 6, 400   # sessions at most; enough once this many calls were checked
PROVIDER_TAGS = {"tenants", "nodes", "pools", "ops", "spot"}
PROVIDER_OPERATIONS = {"defineShape", "deleteShape", "setTenantQuota", "setTenantStorageQuota", "putSpendCap", "deleteSpendCap"}
_CONSTRAINT = re.compile(r"^(\w+) <= (\w+)$")
SHAPE_IDS = {"name": "vm.1gpu"}       # the shape operations' {name}: a shape that exists (the pools' is "shared")
# the fuzzer calls as fast as it can, so a valid request could meet a 429 (documented, but "valid data refused"):
# its buckets are sized beyond its reach, and the limiter still answers every call (its headers included)
UNTHROTTLED = {f"rate_{scope}_{cls}_{what}": 1_000_000 for scope in ("tenant", "user") for cls in ("read", "write")
               for what in ("per_s", "burst")} | {"rate_token_per_s": 1_000_000, "rate_token_burst": 1_000_000}
FUZZ_CLASS = {"name": "fuzz", "backend": "btrfs", "max_volume_bytes": MAX_VOLUME_BYTES, "default": True,
              "simulated": False}


@dataclass
class World:
    """What exists on the gateway and who may call it."""

    base_url: str
    admin: str                                          # Authorization header values
    tenant_admin: str
    ids: dict[str, str]                                 # path parameter -> a value naming something that exists
    shapes: list[str]
    tenant_user: str = ""
    role: str = "natural"                               # natural: each operation's own role; else one role for all
    failures: list[str] = field(default_factory=list)
    calls: int = 0
    linked: list[str] = field(default_factory=list)     # operations answered 2xx on an item made in the sequence
    restarts: int = 0                                   # stateful sessions that ended early (see _stateful)

    def authorization(self, operation) -> str | None:
        op_id, tag = operation.definition.raw["operationId"], operation.tags[0]
        if op_id == "createToken":
            return f"ApiKey {ADMIN_KEY}"
        if op_id == "getOpenApi":
            return None
        if self.role != "natural":
            return {"provider_admin": self.admin, "tenant_admin": self.tenant_admin, "tenant_user": self.tenant_user}[self.role]
        return self.admin if tag in PROVIDER_TAGS or op_id in PROVIDER_OPERATIONS else self.tenant_admin


async def _world(api, nc) -> World:
    admin = await api.admin()
    tenant_id = await api.new_tenant()
    owner, user = await api.new_user(tenant_id, "tenant_admin")
    member_client, member = await api.new_user(tenant_id)   # the {user_id} of the user routes (disabling it leaves
    # the fuzzing callers be), and the tenant user of the tenant-user run
    await project(api, nc, "storage.classes_announced", {"classes": [FUZZ_CLASS], "default_quota_bytes": MAX_QUOTA_BYTES,
                                                          "default_quota_volumes": MAX_QUOTA_VOLUMES})
    node = await admin.post("/v1/nodes", {"name": f"fuzz-node-{uuid.uuid4().hex[:6]}", "gpu_model": "H100", "gpu_count": 8})
    allocation = await owner.post("/v1/allocations", {"name": "fuzz", "shape": "vm.1gpu"})
    network = await owner.post("/v1/networks", {"name": "fuzz", "cidr": "10.99.0.0/24"})
    volume = await owner.post("/v1/volumes", {"name": "fuzz", "size_bytes": MIN_VOLUME_BYTES})
    shapes = await owner.get("/v1/shapes")
    assert (node.status, allocation.status, network.status, volume.status, shapes.status) == (202, 202, 202, 202, 200)
    now = datetime.now(UTC).isoformat()
    await project(api, nc, "storage.volume_changed", {"volume": {     # the storage service made it: it can grow
        "volume_id": volume.body["id"], "tenant_id": tenant_id, "user_id": user["id"], "name": "fuzz",
        "storage_class": FUZZ_CLASS["name"], "backend": "btrfs", "size_bytes": MIN_VOLUME_BYTES, "state": "available",
        "version": 1, "created_at": now, "updated_at": now}}, tenant_id)
    ids = {"tenant_id": tenant_id, "user_id": member["id"], "node_id": node.body["id"],
           "allocation_id": allocation.body["id"], "network_id": network.body["id"], "name": "shared", "pool": "shared",
           "gpu_model": "H100", "volume_id": volume.body["id"], "storage_class": FUZZ_CLASS["name"]}
    return World(f"http://127.0.0.1:{api.rt.port}", f"Bearer {admin.token}", f"Bearer {owner.token}", ids,
                 [s["name"] for s in shapes.body["items"]], tenant_user=f"Bearer {member_client.token}")


def _body_schema(operation) -> dict | None:
    body = operation.definition.raw.get("requestBody", {}).get("content", {}).get("application/json")
    if body is None:
        return None
    name = body["schema"]["$ref"].rsplit("/", 1)[1]
    return operation.schema.raw_schema["components"]["schemas"][name]


def _seed(world: World, operation, case, use_live_ids: bool) -> None:
    """A valid case, told what the document refers to but cannot list (see the module's docstring)."""
    if use_live_ids:
        live = {**world.ids, **SHAPE_IDS} if operation.tags[0] == "shapes" else world.ids
        for name in case.path_parameters or {}:
            if name in live:
                case.path_parameters[name] = live[name]
    if case.headers and "Idempotency-Key" in case.headers:
        case.headers["Idempotency-Key"] = uuid.uuid4().hex
    body, schema = case.body, _body_schema(operation)
    if not isinstance(body, dict) or schema is None:
        return
    op_id = operation.definition.raw["operationId"]
    if isinstance(body.get("tenant_id"), str):       # a tenant that exists (an unknown one is a documented 422)
        body["tenant_id"] = world.ids["tenant_id"]
    if op_id == "putPriceList":                       # billing's rules JSON Schema cannot state (documented 422s)
        body["effective_from"] = (datetime.now(UTC) + timedelta(days=1, seconds=zlib.crc32(
            repr(body).encode()) % 86400)).isoformat()   # never in the past, and one instant per version
        if isinstance(body.get("gpu_prices"), list):
            seen, unique = set(), []
            for price in body["gpu_prices"]:
                if isinstance(price, dict) and price.get("shape") is not None:   # a shape implies model and pool
                    price.pop("gpu_model", None)
                    price.pop("pool", None)
                selectors = tuple(price.get(k) for k in ("shape", "gpu_model", "pool")) if isinstance(price, dict) else None
                if selectors not in seen:
                    seen.add(selectors)
                    unique.append(price)
            body["gpu_prices"] = unique
    if op_id == "createPolicy" and body.get("scope") == "tenant":   # a provider admin's tenant policy names its tenant
        body["tenant_id"] = world.ids["tenant_id"]
    if op_id in ("createPolicy", "replacePolicy") and isinstance(body.get("text"), str):
        body["text"] = POLICY_TEXT
    if op_id == "evaluatePolicy":
        body["operation"] = "createAllocation"
        if isinstance(body.get("candidate"), str):
            body["candidate"] = POLICY_TEXT
    if operation.definition.raw["operationId"] in ("createAllocation", "createCluster", "setSpotOffering") and \
            isinstance(body.get("shape"), str):
        body["shape"] = world.shapes[zlib.crc32(body["shape"].encode()) % len(world.shapes)]
    if operation.definition.raw["operationId"] == "createAllocation":
        # the catalog's images, the caller's stored keys and volumes are live data the fuzzer cannot list (a
        # documented 422)
        for name in ("image", "key_names", "volumes"):
            body.pop(name, None)
    if "storage_class" in body or "scratch_class" in body:
        body.update({k: FUZZ_CLASS["name"] for k in ("storage_class", "scratch_class") if isinstance(body.get(k), str)})
    if op_id == "createNetwork" and isinstance(body.get("cidr"), str) and body["cidr"][:1].isdigit():
        # the provider's choice (TESSERA_NETWORKS_ALLOW_PUBLIC_SUBNETS, off here): a public subnet is a documented
        # 422; its first octet, all network bits from /16 on, moved into 10.0.0.0/8
        body["cidr"] = "10." + body["cidr"].split(".", 1)[-1]
    _mend_constraints(body, schema)
    auto = body.get("autoscaling") if op_id == "createCluster" else None
    if isinstance(auto, dict):   # a nested object's own rules (AutoscalingIn: min_nodes <= max_nodes)
        _mend_constraints(auto, operation.schema.raw_schema["components"]["schemas"]["AutoscalingIn"])


def _mend_constraints(body: dict, schema: dict) -> None:
    """Swap the two values of each ``x-constraints`` rule of ``schema`` that ``body`` breaks."""
    for rule in schema.get("x-constraints", []):
        low, high = _CONSTRAINT.match(rule).groups()
        a, b = body.get(low), body.get(high)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a > b:
            body[low], body[high] = b, a


def _call(world: World, session: requests.Session, operation, case, use_live_ids: bool = False) -> None:
    positive = case.meta is None or case.meta.generation.mode.is_positive
    if positive:
        _seed(world, operation, case, use_live_ids)
    auth = world.authorization(operation)
    world.calls += 1
    try:
        response = case.call(base_url=world.base_url, session=session,
                             headers={"Authorization": auth} if auth else None, timeout=10)
        # a documented 502/503/504 of an absent node-agent or coordinator is no server error here
        checks = [c for c in CHECKS if c is not not_a_server_error] if _agent_missing(response) else CHECKS
        case.validate_response(response, checks=checks)
    except (AssertionError, BaseExceptionGroup) as exc:   # a check failed: keep the report, go on
        world.failures.append(f"{operation.label} ({'valid' if positive else 'invalid'} data):\n{exc}")


def _fuzz(world: World, session: requests.Session, schema, operation) -> None:
    generation = schema.config.generation_for(operation=operation, phase="coverage")
    coverage = schema.iter_coverage_cases(operation, generation_modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
                                          generation_config=generation)
    for case in coverage if world.role == "natural" else itertools.islice(coverage, OTHER_ROLE_COVERAGE):
        _call(world, session, operation, case)
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
        @given(case=operation.as_strategy(generation_mode=mode), use_live_ids=st.booleans())
        @settings(max_examples=FUZZ_EXAMPLES if world.role == "natural" else OTHER_ROLE_EXAMPLES, derandomize=True,
                  database=None, deadline=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck), verbosity=hypothesis.Verbosity.quiet)
        def fuzzed(case, use_live_ids):
            _call(world, session, operation, case, use_live_ids)
        try:
            fuzzed()
        except Unsatisfiable:   # nothing of the operation can be made invalid (no parameters, no body)
            assert mode is GenerationMode.NEGATIVE, operation.label


def _run(world: World) -> None:
    rejected = [*NEGATIVE_DATA_REJECTION_EXPECTED_STATUSES, "413"]
    config = schemathesis.Config.from_dict({"seed": SEED, "generation": {"with-security-parameters": False},
                                            "checks": {"negative_data_rejection": {"expected-statuses": rejected}}})
    schema = schemathesis.openapi.from_url(f"{world.base_url}/openapi.json", config=config)
    with requests.Session() as session:
        for result in schema.get_all_operations():
            operation = result.ok()
            if operation.definition.raw["operationId"] not in STREAMS:
                _fuzz(world, session, schema, operation)


def _agent_missing(response) -> bool:
    """A documented 502/503/504 that says a node's agent or the saga coordinator did not answer: nodes the fuzzer
    registers along the links (POST /v1/nodes, then PUT its BMC, then validate it) have no node-agent running, and
    no coordinator answers GET /v1/allocations/{id}/steps here (its answers are tested in test_saga_steps_gateway.py)."""
    if response.status_code not in (502, 503, 504):
        return False
    try:
        kind = response.json().get("type", "")
    except ValueError:
        return False
    return kind.rsplit("/", 1)[-1] in ("node-timeout", "node-unavailable", "node-failed", "saga-unavailable")


def _stateful(world: World) -> None:
    """Sequences of calls that follow the document's links (a created item's id into the operations on it), each
    answer checked as above plus the stateful checks: a created item can be read, a deleted one is gone."""
    config = schemathesis.Config.from_dict({"seed": SEED, "generation": {"with-security-parameters": False},
                                            "checks": {"negative_data_rejection": {"expected-statuses": [
                                                *NEGATIVE_DATA_REJECTION_EXPECTED_STATUSES, "413"]}},
                                            # the document's own links only (none guessed from names)
                                            "phases": {"stateful": {"inference": {"algorithms": []}}}})
    schema = schemathesis.openapi.from_url(f"{world.base_url}/openapi.json", config=config).exclude(
        operation_id=sorted(STREAMS))
    session = requests.Session()

    class Links(schema.as_state_machine()):
        def before_call(self, case) -> None:
            if case.meta is None or case.meta.generation.mode.is_positive:
                _seed(world, case.operation, case, use_live_ids=False)   # links supply the ids

        def get_call_kwargs(self, case) -> dict:
            auth = world.authorization(case.operation)
            return {"base_url": world.base_url, "session": session, "timeout": 10,
                    "headers": {"Authorization": auth} if auth else {}}

        def validate_response(self, response, case, additional_checks=None, **kwargs) -> None:
            world.calls += 1
            if response.status_code < 300 and set((case.path_parameters or {}).values()) - set(world.ids.values()):
                world.linked.append(case.operation.definition.raw["operationId"])   # on an item a POST made
            checks = CHECKS + STATEFUL_CHECKS
            if _agent_missing(response):   # a node the fuzzer registered has no agent: its documented 502/503/504
                checks = [c for c in checks if c is not not_a_server_error]
            try:
                case.validate_response(response, checks=checks, transport_kwargs=kwargs)
            except (AssertionError, BaseExceptionGroup) as exc:
                world.failures.append(f"{case.operation.label} (linked):\n{exc}")

    # The live server's state steers which links can be followed, so Hypothesis may find a replayed prefix drawing
    # differently (FlakyStrategyDefinition): then, as Schemathesis' own runner does, go on in a fresh session
    try:
        for _ in range(STATEFUL_SESSIONS):
            try:
                Links.run(settings=settings(max_examples=STATEFUL_EXAMPLES, stateful_step_count=6, database=None,
                                            deadline=None, suppress_health_check=list(HealthCheck),
                                            phases=[Phase.generate], verbosity=hypothesis.Verbosity.quiet))
            except FlakyStrategyDefinition:
                world.restarts += 1
            if world.calls >= STATEFUL_CALLS:
                break
    finally:
        session.close()


async def test_the_live_gateway_follows_its_own_links(gateway, nc, run_service):
    """Stateful: call sequences along the document's links (POST → the operations on what it created), as each
    operation's own role; every answer as documented, a created item readable, a deleted one gone."""
    await run_service("billing", lambda s: billing_build(s, checkpoint_s=0, cut_s=0))
    api = await gateway(**UNTHROTTLED)
    world = await _world(api, nc)
    started = time.monotonic()
    await asyncio.to_thread(_stateful, world)
    elapsed = time.monotonic() - started
    print(f"schemathesis (links): {world.calls} requests in {elapsed:.1f} s, {world.restarts} sessions restarted")
    assert world.calls >= STATEFUL_CALLS, world.calls
    followed = set(world.linked)
    print(f"followed links into: {sorted(followed)}")
    assert len(followed) >= 6, sorted(followed)       # sequences really went from a POST to what it made
    assert world.failures == [], (f"{len(world.failures)} of {world.calls} linked requests failed a check "
                                  f"({elapsed:.0f} s):\n\n" + "\n\n".join(world.failures[:20]))


@pytest.mark.parametrize("role", ["natural", "provider_admin", "tenant_admin", "tenant_user"])
async def test_the_live_gateway_does_what_its_openapi_document_says(gateway, nc, run_service, role):
    """natural: each operation as the role it is for; then every operation as each role (refusals documented)."""
    # billing answers the routes that ask it live (GET /v1/ops/ledger/verify): without it they are 503s
    await run_service("billing", lambda s: billing_build(s, checkpoint_s=0, cut_s=0))
    api = await gateway(**UNTHROTTLED)
    world = await _world(api, nc)
    world.role = role
    started = time.monotonic()
    await asyncio.to_thread(_run, world)      # Schemathesis is synchronous; the gateway serves on this loop meanwhile
    elapsed = time.monotonic() - started
    print(f"schemathesis: {world.calls} requests in {elapsed:.1f} s")
    assert world.calls > 1000, world.calls
    assert world.failures == [], (f"{len(world.failures)} of {world.calls} requests failed a check "
                                  f"({elapsed:.0f} s):\n\n" + "\n\n".join(world.failures[:20]))
