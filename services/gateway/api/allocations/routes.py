"""Allocations of the caller's tenant: request (idempotent), list, read, release.

Another tenant's allocation, or a malformed id, is a 404, never a 403: a caller
learns nothing about what other tenants hold.

A request is quoted the GPU-hour price of the price list in force (``quote``), snapshotted on the allocation and
sent with it: billing rates the allocation's GPU usage with that price for its whole life. No version in force, or
no price matching, is no quote (null): billing then rates each hour with the list in force at that hour, or leaves
it unrated. A shape that names no GPU model is not quoted when the version prices GPU models other than by shape
(the model is known only once placed). A tenant whose month's spend reached the provider's cap is refused
(``budgets.check_spend_cap``).
"""
from __future__ import annotations

import json
import uuid
from datetime import datetime

import asyncpg
from aiohttp import web

from services.allocation.contracts import ReleaseAllocation, RequestAllocation
from services.billing.contracts import PriceSnapshot
from services.billing.contracts.pricing import quote_gpu_hour
from services.saga.contracts import WithdrawAllocation
from services.scheduler.contracts import CancelRequest
from shared.envelope import utcnow
from shared.unit_of_work import UnitOfWork

from ...adapters import allocations as repo
from ...adapters.admission import QuotaProblem, SpendCapProblem, check_quota, check_spend_cap
from ...adapters.audit_state import StateReader, ids, select_object
from ...adapters.catalog import known_shapes, resolve_image, resolve_shape
from ...adapters.inventory import plain
from ...domain.keys import fingerprint
from ...domain.model import RELEASE_ALREADY_REQUESTED, Principal, allocation_links
from ...domain.scheduling import DEFAULT_POOL, PRIORITY_CLASSES, ShapeInfo, priority_class_of
from ...http.auth import principal_of, require_tenant_member
from ...http.endpoint import Endpoint, Param, respond
from ...http.inputs import header_value, path_uuid, read_body
from ...http.paging import CURSOR, LIMIT, read_page
from ...http.params import ALLOCATION_ID
from ...http.problems import ProblemError, not_found
from ...http.schema_base import FieldError, Problem, text
from ...http.state import gateway_of
from .events import ENDPOINTS as EVENT_ENDPOINTS
from .guests import UNRESOLVED, guest_for
from .power_schemas import InstanceOut
from .schemas import AllocationCreate, AllocationOut, AllocationPage
from .volumes import charge_scratch, scratch_class, volume_refs

IDEMPOTENCY_HEADER = "Idempotency-Key"


_SCHEDULING = ("priority", "spot", "pool", "tolerations", "fail_fast", "network_id", "queue_position", "queued_reason",
               "preemption", "interruption", "problem", "image", "instance", "volumes", "scratch_class",
               "release_requested_at")
# fields that came after requests were first fingerprinted: left out of the fingerprint when not sent, so a
# retry across an upgrade still matches its Idempotency-Key
_LATER_FIELDS = ("image", "ssh_keys", "key_names", "volumes", "scratch_class")


def allocation_out(row: asyncpg.Record | dict) -> AllocationOut:
    """The allocation as shown, with its quoted price (null: none was quoted)."""
    fields = {k: row[k] for k in ("id", "tenant_id", "name", "shape", "gpu_count", "volume_gb", "state", "node_id",
                                  "failed_step", "reason", "created_at", "updated_at")}
    decoded = plain(row) if isinstance(row, asyncpg.Record) else row
    scheduling = {k: decoded[k] for k in _SCHEDULING if decoded.get(k) is not None}
    if "instance" in scheduling:
        scheduling["instance"] = InstanceOut.shown(scheduling["instance"])
    price = decoded.get("price")
    price = json.loads(price) if isinstance(price, str) else price
    return AllocationOut(**fields, **scheduling, priority_class=priority_class_of(scheduling.get("priority", 0)),
                         labels=repo.labels_of(row), links=allocation_links(row["id"]), price=price)


def quote(doc: dict, shape: ShapeInfo, pool: str, spot: bool, now: datetime) -> PriceSnapshot | None:
    """The GPU-hour price of price-list version ``doc`` for the shape in the pool (billing's rules:
    services.billing.contracts.pricing.quote_gpu_hour); None when nothing matches or the placement would decide it."""
    return quote_gpu_hour(doc, shape=shape.name, gpu_model=shape.gpu_model, pool=pool, spot=spot,
                          gpus=shape.gpu_count, now=now)


def _new_allocation(p: Principal, body: AllocationCreate, shape: ShapeInfo, allocation_id: uuid.UUID) -> dict:
    now = utcnow()
    return {"id": allocation_id, "tenant_id": p.tenant_id, "user_id": p.user_id, "name": body.name, "shape": body.shape,
            "gpu_count": shape.gpu_count, "volume_gb": body.volume_gb, "labels": body.labels, "state": "REQUESTED",
            "node_id": None, "failed_step": None, "reason": None, "created_at": now, "updated_at": now,
            "priority": PRIORITY_CLASSES[body.priority_class], "spot": body.spot, "pool": body.pool,
            "tolerations": body.tolerations, "fail_fast": body.fail_fast, "network_id": body.network_id,
            "volumes": [v.model_dump(mode="json") for v in body.volumes], "scratch_class": body.scratch_class}


def _request_hash(body: AllocationCreate) -> str:
    sent = body.model_dump(mode="json")
    return fingerprint({k: v for k, v in sent.items() if k not in _LATER_FIELDS or k in body.model_fields_set})


def _replay(held: asyncpg.Record, request_hash: str) -> web.Response:
    """The stored answer to the request that holds the key; a 422 when this request's body differs."""
    if held["request_hash"] != request_hash:
        raise ProblemError(422, "this Idempotency-Key was already used with a different body",
                           slug="idempotency-key-reused", errors=[FieldError(
                               field=IDEMPOTENCY_HEADER, message="reused with a different body", code="reused")])
    return _accepted(held["response"], held["allocation_id"], replayed=True)


async def quote_now(conn: asyncpg.Connection, shape: ShapeInfo, pool: str | None, spot: bool,
                    now: datetime) -> PriceSnapshot | None:
    """``quote`` with the version in force at ``now`` (the latest effective_from not after it), if any."""
    row = await conn.fetchrow("SELECT effective_from, body FROM price_lists_view WHERE effective_from <= $1 "
                              "ORDER BY effective_from DESC, published_at DESC LIMIT 1", now)
    if row is None:
        return None
    body = json.loads(row["body"]) if isinstance(row["body"], str) else dict(row["body"])
    return quote({**body, "effective_from": row["effective_from"]}, shape, pool or DEFAULT_POOL, spot, now)


def _accepted(body: str, allocation_id, replayed: bool = False) -> web.Response:
    headers = {"Location": allocation_links(allocation_id)["self"]}
    if replayed:
        headers["Idempotent-Replayed"] = "true"
    return web.Response(status=202, text=body, content_type="application/json", headers=headers)


async def create_allocation(request: web.Request) -> web.Response:
    p = require_tenant_member(request)
    key = header_value(request, IDEMPOTENCY)
    body = await read_body(request, AllocationCreate)
    gw = gateway_of(request)
    request_hash = _request_hash(body)
    async with gw.unit_of_work("gateway.create_allocation") as uow:
        conn = uow.conn
        # a retry is answered as the first request was, whatever changed since (an image or shape deleted)
        held = await repo.held_idempotency_key(conn, p.tenant_id, key) if key is not None else None
        if held is not None:
            return _replay(held, request_hash)
        judged = request.get(_JUDGED)
        shape = judged[0] if judged is not None else await resolve_shape(conn, body.shape)
        allocation_id = uuid.uuid4()
        guest = await guest_for(conn, p, body, allocation_id, image=judged[1] if judged is not None else UNRESOLVED)
        volumes = await volume_refs(conn, p, body)
        offer, scratch = await scratch_class(conn, body)
        alloc = _new_allocation(p, body, shape, allocation_id)
        alloc["image"] = guest.image.name if guest else None
        price = await quote_now(conn, shape, body.pool, body.spot, alloc["created_at"])
        alloc["price"] = price.model_dump(mode="json") if price else None
        out = allocation_out(alloc)
        if key is not None:
            held = await repo.claim_idempotency_key(conn, p.tenant_id, key, request_hash, alloc["id"],
                                                    out.model_dump(mode="json"))
            if held is not None:
                return _replay(held, request_hash)
        await check_quota(conn, p, shape, body.pool)   # raising rolls the key claim back too
        await check_spend_cap(conn, p.tenant_id, alloc["created_at"])
        await charge_scratch(conn, p, body, offer, scratch)
        await repo.insert(conn, alloc)
        await uow.emit("allocation.request", RequestAllocation(
            allocation_id=alloc["id"], tenant_id=p.tenant_id, user_id=p.user_id, name=body.name, shape=body.shape,
            gpu_count=alloc["gpu_count"], volume_gb=body.volume_gb, labels=body.labels, priority=alloc["priority"],
            spot=body.spot, pool=body.pool, tolerations=body.tolerations, fail_fast=body.fail_fast,
            network_id=body.network_id, guest=guest, volumes=volumes, scratch_class=body.scratch_class, price=price),
            correlation_id=str(alloc["id"]), tenant_id=p.tenant_id)
    return _accepted(out.model_dump_json(), alloc["id"])


async def list_allocations(request: web.Request) -> web.Response:
    p = require_tenant_member(request)
    items, next_cursor = await read_page(request, lambda conn, n, after: repo.page(conn, p.tenant_id, n, after))
    return respond(AllocationPage(items=[allocation_out(r) for r in items],
                                  next_cursor=next_cursor))


async def get_allocation(request: web.Request) -> web.Response:
    p = require_tenant_member(request)
    allocation_id = path_uuid(request, "allocation_id", "allocation")
    async with gateway_of(request).pool.acquire() as conn:
        row = await repo.get(conn, allocation_id, p.tenant_id)
    if row is None:
        raise not_found("allocation")
    return respond(allocation_out(row))


async def _ask_once(uow: UnitOfWork, row: asyncpg.Record, p: Principal, marker: str, command: str,
                    model: type[CancelRequest] | type[WithdrawAllocation]) -> asyncpg.Record:
    """Send ``command`` about this allocation once: the ``marker`` column records when it was asked; a repeated
    DELETE finds it set and sends nothing again. Returns the allocation's row as it now is."""
    if row[marker] is None:
        await repo.update(uow.conn, row["id"], **{marker: utcnow()})
        await uow.emit(command, model(allocation_id=row["id"], tenant_id=p.tenant_id, requested_by=p.user_id),
                       correlation_id=str(row["id"]), tenant_id=p.tenant_id)
    return await repo.get(uow.conn, row["id"])


async def _cancel_queued(uow: UnitOfWork, row: asyncpg.Record, p: Principal) -> asyncpg.Record:
    """A QUEUED allocation is cancelled, once: the scheduler drops the request and the saga fails it (cancelled)."""
    return await _ask_once(uow, row, p, "cancel_requested_at", "scheduler.cancel_request", CancelRequest)


async def _withdraw_requested(uow: UnitOfWork, row: asyncpg.Record, p: Principal) -> asyncpg.Record:
    """A REQUESTED or PROVISIONING allocation is withdrawn, once: the saga coordinator takes it out of its
    tenant's line and has it released at once (nothing was reserved), or, when its saga had started, has it
    released once ACTIVE (nothing when the saga fails: the allocation ends FAILED, its steps undone), as Nova
    deletes a server still building. ``release_requested_at`` shows the release asked for meanwhile."""
    return await _ask_once(uow, row, p, "release_requested_at", "saga.withdraw", WithdrawAllocation)


async def release_allocation(request: web.Request) -> web.Response:
    """202 and one allocation.release for an ACTIVE allocation, or an INTERRUPTED one (the allocation service keeps
    the release until the reschedule has placed it again, then releases it); 202 again (nothing sent) once
    releasing. A QUEUED allocation is cancelled instead (one scheduler.cancel_request), a REQUESTED or
    PROVISIONING one withdrawn (one saga.withdraw: released once ACTIVE)."""
    p = require_tenant_member(request)
    allocation_id = path_uuid(request, "allocation_id", "allocation")
    gw = gateway_of(request)
    async with gw.unit_of_work("gateway.release_allocation") as uow:
        conn = uow.conn
        row = await repo.get(conn, allocation_id, p.tenant_id, for_update=True)
        if row is None:
            raise not_found("allocation")
        if row["state"] == "QUEUED":
            row = await _cancel_queued(uow, row, p)
        elif row["state"] in ("REQUESTED", "PROVISIONING") or (
                row["state"] == "ACTIVE" and row["release_requested_at"] is not None):
            # (an ACTIVE one asked for before it was: its release is the coordinator's to send)
            row = await _withdraw_requested(uow, row, p)
        elif row["state"] not in RELEASE_ALREADY_REQUESTED:
            if row["state"] not in ("ACTIVE", "INTERRUPTED"):
                raise ProblemError(409, f"the allocation is {row['state']}; only an ACTIVE, INTERRUPTED, QUEUED, "
                                        "REQUESTED or PROVISIONING allocation can be released", slug="allocation-not-active")
            # optimistic: the real state is never behind the view, so an ACTIVE view means release applies
            await repo.update(conn, allocation_id, state="RELEASING", release_requested_at=utcnow())
            await uow.emit("allocation.release", ReleaseAllocation(
                allocation_id=allocation_id, tenant_id=p.tenant_id, requested_by=p.user_id),
                correlation_id=str(allocation_id), tenant_id=p.tenant_id)
            row = await repo.get(conn, allocation_id)
    return respond(allocation_out(row), 202,
                   headers={"Location": allocation_links(allocation_id)["self"]})


# visible ASCII (a header carries no other characters intact), no space at either end (it would be stripped)
IdempotencyKey = text(255, min_length=1, pattern=r"^[!-~]([ -~]*[!-~])?$")
IDEMPOTENCY = Param(IDEMPOTENCY_HEADER, "header", "Retry-safe creation: the same key and body answer the same 202, "
                    "creating one allocation; the same key with another body is a 422.", IdempotencyKey)
_CREATED = {"Location": "The allocation (/v1/allocations/{id})."}
_BODY_ERRORS = (400, 401, 403, 413, 415, 422)

# the shape and image the policy judged, kept on the request: the handler creates what was judged, without reading
# them again (under READ COMMITTED the handler's own read could have seen the same rows a moment earlier anyway)
_JUDGED = web.RequestKey("allocation_judged", tuple)


async def allocation_resource(request: web.Request, data: dict, body) -> tuple[dict, dict] | None:
    """The policy resource of a POST /v1/allocations: its shape, pool, image and flags; its tags are its labels.
    None for an unknown shape or image (the handler answers those with their 422)."""
    async with gateway_of(request).pool.acquire() as conn:
        shape = (await known_shapes(conn)).get(body.shape)
        if shape is None:
            return None
        try:
            image = await resolve_image(conn, principal_of(request), body.image)
        except ProblemError:
            return None
    request[_JUDGED] = (shape, image)
    attrs = {"name": body.name, "shape": shape.name, "gpu_count": shape.gpu_count, "pool": body.pool or DEFAULT_POOL,
             "image_approved": True, "spot": body.spot, "privileged": data.get("privileged") is True,
             "priority_class": body.priority_class}
    if shape.gpu_model:
        attrs["gpu_model"] = shape.gpu_model
    if image is not None:
        attrs["image"] = image["name"]
    return attrs, {str(k): str(v) for k, v in body.labels.items()}   # an allocation's tags are its labels


_ALLOCATION = StateReader(select_object("allocations_view", "id = $1", "name", "state", "shape", "gpu_count",
                                        "node_id", "release_requested_at"), ids("allocation_id"))


ENDPOINTS = [
    Endpoint("POST", "/v1/allocations", create_allocation, "createAllocation", "Request an allocation", "allocations",
             {202: AllocationOut}, body=AllocationCreate, params=(IDEMPOTENCY,), errors=_BODY_ERRORS,
             problems={403: (Problem, QuotaProblem, SpendCapProblem)}, headers={202: _CREATED},
             description="Accepted as REQUESTED; the saga provisions it. Provider admins (no tenant) get 403. A request "
                         "the tenant's (or the user's) quota certainly cannot admit is refused at once with 403 "
                         "`quota-exceeded` and the members quota, limit, used and requested. "
                         "When nothing fits the allocation waits as QUEUED (unless fail_fast). The guest boots "
                         "`image`, or the catalog's default image when it names none; with neither, no image is sent "
                         "(the driver boots its own). Its hostname is made from the allocation's name. It authorises "
                         "`ssh_keys` and the caller's stored keys named in `key_names`, or, when the request sends "
                         "neither, every key the caller stored. The response "
                         "shows the image's name; once ACTIVE, `instance` shows what runs (on a host without GPUs "
                         "the libvirt driver runs the guest with passthrough `simulated`). It mounts `volumes` (volumes "
                         "of the tenant, each at /mnt/<name>) and "
                         "gets a scratch volume of `volume_gb` GB in `scratch_class` (or the default class), charged "
                         "against the storage quota (403 `quota-exceeded`). `price` "
                         "is the GPU-hour price quoted from the price list in force, with which billing rates the "
                         "allocation for its whole life (null: none was in force or matched; its usage is then rated "
                         "hourly with the list in force, or left unrated). A tenant whose rated spend this month "
                         "reached the provider's spend cap is refused with 403 `spend-cap-exceeded` (members limit, "
                         "used, currency; checked by the gateway only, running allocations are untouched). Rules "
                         "the schema cannot state (each a 422 naming the field): `shape` is one GET /v1/shapes "
                         "lists; `image` is the name or id of an image GET /v1/images lists to the caller; each of "
                         "`key_names` is a key the caller stored, and `ssh_keys` and `key_names` add up to at most "
                         "32 distinct keys; each of `volumes` is a volume of the tenant that can be mounted now "
                         "(available, or in use and shared) and is named once (the schema's uniqueItems catches "
                         "only entries written alike); `scratch_class` is a class GET /v1/storage-classes lists; "
                         "an Idempotency-Key already used comes with the same body.",
             policy_resource=allocation_resource),
    Endpoint("GET", "/v1/allocations", list_allocations, "listAllocations", "List the tenant's allocations, newest first",
             "allocations", {200: AllocationPage}, params=(LIMIT, CURSOR), errors=(401, 403, 422)),
    Endpoint("GET", "/v1/allocations/{allocation_id}", get_allocation, "getAllocation", "Read an allocation",
             "allocations", {200: AllocationOut}, params=(ALLOCATION_ID,), errors=(401, 403, 404)),
    Endpoint("DELETE", "/v1/allocations/{allocation_id}", release_allocation, "releaseAllocation",
             "Release an ACTIVE allocation, or cancel a QUEUED one", "allocations", {202: AllocationOut},
             params=(ALLOCATION_ID,), errors=(401, 403, 404, 409), headers={202: _CREATED},
             description="Repeating it while RELEASING or RELEASED answers 202 again. A QUEUED allocation is "
                         "cancelled: it ends FAILED (cancelled) once the scheduler dropped it. A REQUESTED one "
                         "waiting in its tenant's line (`queued_reason` `tenant_line`) leaves the line and ends "
                         "RELEASED at once, nothing reserved; one whose provisioning had started (REQUESTED out of "
                         "its line, or PROVISIONING) is released once ACTIVE (none if it fails).",
             audit_state=_ALLOCATION),
    *EVENT_ENDPOINTS,
]
