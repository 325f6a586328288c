"""Tenant clusters: create (tenant admins; idempotent), list, read, scale, delete.

Writes are accepted with 202 and travel to the paas service as commands through the outbox; the read model
shows what the gateway asked for ('placing', a pending scale, 'deleting') until the service answers with the
cluster's next document (``projection``). A creation is refused up front, nothing sent, as an allocation's is:
an unknown shape (422), a network that is not the tenant's (404), the GPU quota for N × the shape's GPUs (403
quota-exceeded), the spend cap, and the policies judging each of its N allocations (403 policy-denied). A
cluster over allocations the tenant already holds (``allocation_ids``) is checked as ``adopt`` says instead.
Another tenant's cluster, or a malformed id, is a 404, never a 403.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import replace

import asyncpg
from aiohttp import web

from services.paas.contracts import CreateCluster, DeleteCluster, ScaleCluster
from shared.envelope import utcnow

from ...adapters import paas as repo
from ...adapters.admission import QuotaProblem, SpendCapProblem, check_quota, check_spend_cap
from ...adapters.audit_state import StateReader, ids, select_object
from ...adapters.catalog import resolve_shape
from ...domain.keys import fingerprint
from ...domain.model import Principal
from ...domain.scheduling import ShapeInfo
from ...http.auth import require_tenant_member
from ...http.endpoint import Endpoint, Param, respond
from ...http.inputs import header_value, path_uuid, read_body
from ...http.paging import CURSOR, LIMIT, read_page
from ...http.problems import ProblemError, forbidden, not_found
from ...http.schema_base import FieldError, Problem, text
from ...http.state import gateway_of
from .adopt import Held, adopted_nodes, held_allocations, show_nodes
from .policy import judge_nodes
from .schemas import ClusterCreate, ClusterOut, ClusterPage, ClusterScale

IDEMPOTENCY_HEADER = "Idempotency-Key"


def cluster_links(cluster_id) -> dict[str, str]:
    return {"self": f"/v1/clusters/{cluster_id}", "jobs": f"/v1/jobs?cluster_id={cluster_id}"}


def cluster_out(row: asyncpg.Record | dict) -> ClusterOut:
    c = repo.decoded(row) if isinstance(row, asyncpg.Record) else row
    fields = {k: c[k] for k in ("id", "tenant_id", "user_id", "name", "kind", "shape", "gpu_count", "node_count",
                                "network_id", "pool", "priority", "state", "reason", "driver", "controller", "nodes",
                                "autoscaling", "spot", "version", "created_at", "updated_at")}
    pending = c["pending_node_count"]
    return ClusterOut(**fields, requested_node_count=pending if pending != c["node_count"] else None,
                      links=cluster_links(c["id"]))


def require_tenant_admin(request: web.Request) -> Principal:
    """Clusters are made, scaled and deleted by the tenant's admins; its users read them and run jobs."""
    p = require_tenant_member(request)
    if p.role != "tenant_admin":
        raise forbidden("only a tenant admin may create, scale or delete clusters")
    return p


async def cluster_of(conn: asyncpg.Connection, request: web.Request, tenant_id: uuid.UUID, *,
                     for_update: bool = False) -> asyncpg.Record:
    """The path's cluster if it is the tenant's and not deleted; 404 otherwise."""
    row = await repo.cluster(conn, path_uuid(request, "cluster_id", "cluster"), tenant_id, for_update=for_update)
    if row is None:
        raise not_found("cluster")
    return row


async def _require_network(conn: asyncpg.Connection, tenant_id: uuid.UUID, network_id: uuid.UUID | None) -> None:
    if network_id is None:
        return
    state = await conn.fetchval("SELECT state FROM networks_view WHERE id=$1 AND tenant_id=$2", network_id, tenant_id)
    if state not in ("creating", "active"):
        raise not_found("network")


def _replay(held: asyncpg.Record, request_hash: str) -> web.Response:
    if held["request_hash"] != request_hash:
        raise ProblemError(422, "this Idempotency-Key was already used with a different body",
                           slug="idempotency-key-reused", errors=[FieldError(
                               field=IDEMPOTENCY_HEADER, message="reused with a different body", code="reused")])
    body = held["response"] if isinstance(held["response"], str) else json.dumps(held["response"])
    return _accepted(body, held["cluster_id"], replayed=True)


def _accepted(body: str, cluster_id, replayed: bool = False) -> web.Response:
    headers = {"Location": cluster_links(cluster_id)["self"]}
    if replayed:
        headers["Idempotent-Replayed"] = "true"
    return web.Response(status=202, text=body, content_type="application/json", headers=headers)


def _new_cluster(p: Principal, body: ClusterCreate, shape: ShapeInfo | None, held: Held | None) -> dict:
    """The requested cluster's row: of ``shape`` (new allocations) or of the ``held`` allocations."""
    now = utcnow()
    if held is not None:
        form = {"shape": held.shape, "gpu_count": held.gpu_count, "node_count": len(held.members),
                "network_id": held.network_id, "pool": body.pool or held.pool, "nodes": adopted_nodes(body.name, held)}
    else:
        form = {"shape": shape.name, "gpu_count": shape.gpu_count, "node_count": body.nodes,
                "network_id": body.network_id, "pool": body.pool, "nodes": []}
    return {"id": uuid.uuid4(), "tenant_id": p.tenant_id, "user_id": p.user_id, "name": body.name, "kind": body.kind,
            **form, "pending_node_count": None, "priority": body.priority, "state": "placing", "reason": None,
            "driver": None, "controller": None, "spot": False, "version": 0,
            "autoscaling": body.autoscaling.model_dump() if body.autoscaling else None, "created_at": now,
            "updated_at": now}


async def _admit_new(gw, conn: asyncpg.Connection, p: Principal, body: ClusterCreate, shape: ShapeInfo,
                     c: dict) -> None:
    """N new allocations: the GPU quota for all of them, the spend cap, and the policies judging each."""
    await check_quota(conn, p, replace(shape, gpu_count=shape.gpu_count * body.nodes), body.pool)
    await check_spend_cap(conn, p.tenant_id, c["created_at"])
    await judge_nodes(gw, conn, p, body, shape)


async def create_cluster(request: web.Request) -> web.Response:
    p = require_tenant_admin(request)
    key = header_value(request, IDEMPOTENCY)
    body = await read_body(request, ClusterCreate)
    gw, request_hash = gateway_of(request), fingerprint(body.model_dump(mode="json"))
    async with gw.unit_of_work("gateway.create_cluster") as uow:
        conn = uow.conn
        # a retry is answered as the first request was, whatever changed since
        held = await repo.held_cluster_key(conn, p.tenant_id, key) if key is not None else None
        if held is not None:
            return _replay(held, request_hash)
        await _require_network(conn, p.tenant_id, body.network_id)
        # the tenant's creations one at a time from here (before the key's claim, in every form: one lock order):
        # a name, or an allocation made a node, is taken once
        await repo.lock_tenant_clusters(conn, p.tenant_id)
        adopted = await held_allocations(conn, p.tenant_id, body.allocation_ids, body.network_id) \
            if body.allocation_ids else None
        shape = await resolve_shape(conn, body.shape) if adopted is None else None
        c = _new_cluster(p, body, shape, adopted)
        out = cluster_out(c)
        if key is not None:
            held = await repo.claim_cluster_key(conn, p.tenant_id, key, request_hash, c["id"],
                                                out.model_dump(mode="json"))
            if held is not None:
                return _replay(held, request_hash)
        # each refusal below raises, which rolls the key's claim back too
        if await repo.live_cluster_named(conn, p.tenant_id, body.name) is not None:
            raise ProblemError(409, f"a cluster named {body.name!r} already exists", slug="name-taken")
        if adopted is None:
            await _admit_new(gw, conn, p, body, shape, c)
        await repo.insert_cluster(conn, c)
        if adopted is not None:
            await show_nodes(conn, c["id"], c["nodes"])
        await uow.emit("paas.create_cluster", CreateCluster(
            cluster_id=c["id"], tenant_id=p.tenant_id, user_id=p.user_id, name=body.name, kind=body.kind,
            shape=c["shape"], gpu_count=c["gpu_count"], node_count=c["node_count"], network_id=c["network_id"],
            pool=c["pool"], tolerations=body.tolerations, priority=body.priority, autoscaling=c["autoscaling"],
            members=adopted.members if adopted else [], requested_by=str(p.user_id)),
            correlation_id=str(c["id"]), tenant_id=p.tenant_id)
    return _accepted(out.model_dump_json(), c["id"])


async def list_clusters(request: web.Request) -> web.Response:
    p = require_tenant_member(request)
    items, next_cursor = await read_page(request, lambda conn, n, after: repo.cluster_page(conn, p.tenant_id, n, after))
    return respond(ClusterPage(items=[cluster_out(r) for r in items], next_cursor=next_cursor))


async def get_cluster(request: web.Request) -> web.Response:
    p = require_tenant_member(request)
    async with gateway_of(request).pool.acquire() as conn:
        row = await cluster_of(conn, request, p.tenant_id)
    return respond(cluster_out(row))


def _require_live(row: asyncpg.Record, doing: str) -> None:
    if row["state"] in ("deleting", "deleted", "failed"):
        raise ProblemError(409, f"the cluster is {row['state']}; it cannot be {doing}", slug="cluster-not-live")


async def scale_cluster(request: web.Request) -> web.Response:
    """202 and one scale_cluster; growth is checked against the GPU quota first (403 quota-exceeded)."""
    p = require_tenant_admin(request)
    body = await read_body(request, ClusterScale)
    gw = gateway_of(request)
    async with gw.unit_of_work("gateway.scale_cluster") as uow:
        conn = uow.conn
        row = await cluster_of(conn, request, p.tenant_id, for_update=True)
        _require_live(row, "scaled")
        auto = repo.decoded(row)["autoscaling"]
        if auto and not auto["min_nodes"] <= body.nodes <= auto["max_nodes"]:
            # the autoscaler would move it straight back: the cluster's own bounds decide its size
            raise ProblemError(409, f"the cluster autoscales between {auto['min_nodes']} and {auto['max_nodes']} "
                                    "nodes; a count outside them would be undone", slug="outside-autoscaling-bounds")
        growth = body.nodes - max(row["node_count"], row["pending_node_count"] or 0)
        if growth > 0:
            shape = await resolve_shape(conn, row["shape"])
            await check_quota(conn, p, replace(shape, gpu_count=row["gpu_count"] * growth), row["pool"])
        row = await repo.set_cluster(conn, row["id"], pending_node_count=body.nodes)
        await uow.emit("paas.scale_cluster", ScaleCluster(
            cluster_id=row["id"], tenant_id=p.tenant_id, node_count=body.nodes, requested_by=str(p.user_id)),
            correlation_id=str(row["id"]), tenant_id=p.tenant_id)
    return respond(cluster_out(row), 202)


async def delete_cluster(request: web.Request) -> web.Response:
    """202 and one delete_cluster; 202 again (nothing sent) while deleting. A failed cluster is deleted too (its
    allocations released)."""
    p = require_tenant_admin(request)
    gw = gateway_of(request)
    async with gw.unit_of_work("gateway.delete_cluster") as uow:
        row = await cluster_of(uow.conn, request, p.tenant_id, for_update=True)
        if row["state"] != "deleting":
            row = await repo.set_cluster(uow.conn, row["id"], state="deleting")
            await uow.emit("paas.delete_cluster", DeleteCluster(
                cluster_id=row["id"], tenant_id=p.tenant_id, requested_by=str(p.user_id)),
                correlation_id=str(row["id"]), tenant_id=p.tenant_id)
    return respond(cluster_out(row), 202)


# visible ASCII (a header carries no other characters intact), no space at either end
IdempotencyKey = text(255, min_length=1, pattern=r"^[!-~]([ -~]*[!-~])?$")
IDEMPOTENCY = Param(IDEMPOTENCY_HEADER, "header", "Retry-safe creation: the same key and body answer the same 202, "
                    "creating one cluster; the same key with another body is a 422.", IdempotencyKey)
CLUSTER_ID = Param("cluster_id", "path", "The cluster's id.", uuid.UUID, required=True)
_CLUSTER_STATE = StateReader(select_object("clusters_view", "id = $1", "name", "state", "node_count",
                                           "pending_node_count", "version"), ids("cluster_id"))
_QUOTA = {403: (Problem, QuotaProblem, SpendCapProblem)}


ENDPOINTS = [
    Endpoint("POST", "/v1/clusters", create_cluster, "createCluster", "Create a tenant cluster (tenant admins)",
             "clusters", {202: ClusterOut}, body=ClusterCreate, params=(IDEMPOTENCY,),
             errors=(400, 401, 403, 404, 409, 413, 415, 422), problems=_QUOTA,
             headers={202: {"Location": "The cluster (/v1/clusters/{id})."}},
             description="Accepted as `placing`: the paas service places its N nodes as one gang (all or nothing; "
                         "`queued` while they do not fit), requests each as an allocation of the tenant, then starts "
                         "the cluster's scheduler on them (`ready`), or fails it with the reason. Refused up front, "
                         "nothing sent, as POST /v1/allocations refuses: `shape` is one GET /v1/shapes lists (a "
                         "422); `network_id` is a live network of the tenant (else a 404, as for another tenant's "
                         "network); N × the shape's GPUs fit the "
                         "tenant's and the user's GPU quota (403 `quota-exceeded` naming the quota); the spend cap "
                         "(403 `spend-cap-exceeded`); every policy judging `createAllocation` allows each of the N "
                         "allocations (`<name>-<index>`, the shape, the pool, the default image; 403 "
                         "`policy-denied`). `name` is not used by a live cluster of the tenant (a 409). Tenant users "
                         "get 403.\n\nOr over allocations the tenant already holds: `allocation_ids` (1 to 64, each "
                         "once) instead of `shape` and `nodes` (exactly one of the two forms, else a 422). The nodes "
                         "are those allocations in the order given (the first hosts the controller); the cluster "
                         "takes their shape and network and starts on them at once (no gang, nothing allocated, so "
                         "no quota, spend cap or allocation policy is judged; `pool` defaults to theirs). Each "
                         "refusal names the allocation (`errors[].field` `allocation_ids.<i>`): not the tenant's (a "
                         "404); not ACTIVE (409 `allocation-not-active`); spot (409 `allocation-is-spot`: the "
                         "cluster is not spot); without an address on a tenant network (409 "
                         "`allocation-not-attached`); on another network than the first, or than `network_id` (409 "
                         "`allocations-on-different-networks`); of another shape than the first (409 "
                         "`allocations-of-different-shapes`); a node of a live cluster (409 "
                         "`allocation-in-cluster`). Such a node is never released by the cluster: a scale-in or a "
                         "delete drains it, stops the cluster's daemons on it and leaves the allocation ACTIVE "
                         "(node state `returned`); a scale-out adds new allocations of the cluster's shape as a "
                         "gang."),
    Endpoint("GET", "/v1/clusters", list_clusters, "listClusters", "List the tenant's clusters, newest first",
             "clusters", {200: ClusterPage}, params=(LIMIT, CURSOR), errors=(401, 403, 422)),
    Endpoint("GET", "/v1/clusters/{cluster_id}", get_cluster, "getCluster", "Read a cluster and its nodes", "clusters",
             {200: ClusterOut}, params=(CLUSTER_ID,), errors=(401, 403, 404)),
    Endpoint("POST", "/v1/clusters/{cluster_id}/scale", scale_cluster, "scaleCluster",
             "Grow or shrink a cluster (tenant admins)", "clusters", {202: ClusterOut}, body=ClusterScale,
             params=(CLUSTER_ID,), errors=(400, 401, 403, 404, 409, 413, 415, 422), problems=_QUOTA,
             description="The new count shows as `requested_node_count` until the paas service takes it up; "
                         "shrinking drains the nodes it removes first (then releases them; an `adopted` node is "
                         "returned instead, its allocation left ACTIVE); growth adds new allocations. Growth is "
                         "checked against the GPU quota (403 `quota-exceeded`). With autoscaling, a count outside "
                         "its bounds is a 409 (the autoscaler would undo it); so is a cluster deleting or failed."),
    Endpoint("DELETE", "/v1/clusters/{cluster_id}", delete_cluster, "deleteCluster",
             "Delete a cluster and release its allocations (tenant admins)", "clusters", {202: ClusterOut},
             params=(CLUSTER_ID,), errors=(401, 403, 404),
             description="Accepted as `deleting`; repeating it answers 202 again. Once deleted it is a 404 and no "
                         "longer listed. The cluster's scheduler is stopped, then the allocations it requested are "
                         "released; an allocation the tenant held before the cluster (`adopted`) is not: it stays "
                         "ACTIVE, the tenant's.",
             audit_state=_CLUSTER_STATE),
]
