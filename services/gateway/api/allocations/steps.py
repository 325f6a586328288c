"""GET /v1/allocations/{id}/steps: the allocation's sagas and when each of their steps ran, read live from the
saga coordinator (``saga.read_steps``: core NATS request/reply; the gateway stores none of it).

``read_steps`` is the read itself, for any page of the gateway that shows the timeline; it does not check who
asks (the caller scopes the allocation first, as the route does)."""
from __future__ import annotations

import uuid

import structlog
from aiohttp import web

from services.saga.contracts import ReadSteps
from shared import rpc

from ...adapters import allocations as views
from ...http.auth import principal_of, require_tenant_member
from ...http.endpoint import Endpoint, respond
from ...http.inputs import path_uuid
from ...http.params import ALLOCATION_ID
from ...http.problems import not_found
from ...http.rpc_problems import answered
from ...http.state import Gateway, gateway_of
from .steps_schemas import AllocationStepsOut

log = structlog.get_logger()
STEPS_TIMEOUT_S = 5.0   # one indexed read in the saga schema: milliseconds when the coordinator is up


async def read_steps(gw: Gateway, allocation_id: uuid.UUID) -> dict:
    """The allocation's sagas, oldest first: {"items": [{saga_id, kind, state, started_at, finished_at, steps:
    [{step, phase, status, attempt, started_at, finished_at, duration_s, error}]}]} (JSON types: times as RFC 3339
    strings). Raises ProblemError: 503 with Retry-After when no coordinator is connected, 504 when none answers
    within STEPS_TIMEOUT_S, 502 when it fails to read them."""
    with answered("the saga coordinator", "saga", "the allocation's steps cannot be read now",
                  "read the allocation's steps", timeout_s=STEPS_TIMEOUT_S, allocation_id=str(allocation_id)):
        answer = await rpc.request(gw.rt.broker.connection, gw.rt.catalog, "gateway", "saga.read_steps",
                                   ReadSteps(allocation_id=allocation_id), timeout=STEPS_TIMEOUT_S)
    return answer.model_dump(mode="json")


async def get_steps(request: web.Request) -> web.Response:
    """A tenant member reads its own tenant's allocations (another tenant's: 404, as GET /v1/allocations/{id});
    a provider admin any."""
    p = principal_of(request)
    if not p.is_provider_admin:
        p = require_tenant_member(request)
    allocation_id = path_uuid(request, "allocation_id", "allocation")
    gw = gateway_of(request)
    async with gw.pool.acquire() as conn:
        row = await views.get(conn, allocation_id, None if p.is_provider_admin else p.tenant_id)
    if row is None:
        raise not_found("allocation")
    return respond(AllocationStepsOut.model_validate(await read_steps(gw, row["id"])))


ENDPOINTS = [
    Endpoint("GET", "/v1/allocations/{allocation_id}/steps", get_steps, "getAllocationSteps",
             "Read the allocation's saga steps and their timings", "allocations", {200: AllocationStepsOut},
             params=(ALLOCATION_ID,), errors=(401, 403, 404, 502, 503, 504),
             description="Every saga of the allocation (allocate, release, each move), oldest first, and each "
                         "step's status, attempts, start, finish and duration, read live from the saga coordinator "
                         "(each undo follows its step). Tenant members read their tenant's allocations, provider "
                         "admins any. 503 (with Retry-After) when the coordinator is not connected, 504 when it "
                         "does not answer in time, 502 when it fails to read them."),
]
