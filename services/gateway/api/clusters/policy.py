"""A cluster's nodes judged as the allocations they become: a cluster of N nodes is N allocations requested by
the paas service (not through POST /v1/allocations), so the policies that judge ``createAllocation`` judge each
node here, before anything is sent, with the attributes that allocation will have (its name
``<cluster>-<index>``, the shape, the pool, the catalog's default image, not spot, not privileged). A denial is
the same 403 ``policy-denied`` as an allocation's."""
from __future__ import annotations

import asyncpg

from ...adapters.catalog import resolve_image
from ...domain.model import Principal
from ...domain.policy import Resource
from ...domain.scheduling import DEFAULT_POOL, ShapeInfo
from ...http.policy import PolicyDenied, cache_of, caller_of
from ...http.state import Gateway
from .schemas import ClusterCreate


def priority_class(priority: int) -> str:
    """The allocation priority class a cluster's priority falls in (the classes are -100, 0 and 100: any
    priority above 0 is judged as high, below as low)."""
    return "high" if priority > 0 else "low" if priority < 0 else "normal"


async def judge_nodes(gw: Gateway, conn: asyncpg.Connection, p: Principal, body: ClusterCreate,
                      shape: ShapeInfo) -> None:
    """Raise PolicyDenied (403) when a policy forbids any of the cluster's node allocations."""
    image = await resolve_image(conn, p, None)
    attrs = {"shape": shape.name, "gpu_count": shape.gpu_count, "pool": body.pool or DEFAULT_POOL,
             "image_approved": True, "spot": False, "privileged": False,
             "priority_class": priority_class(body.priority)}
    if shape.gpu_model:
        attrs["gpu_model"] = shape.gpu_model
    if image is not None:
        attrs["image"] = image["name"]
    tags = {"cluster": body.name, "cluster_kind": body.kind}
    book, caller = await cache_of(gw).book(), caller_of(p)
    for index in range(body.nodes):
        decision = book.decide(caller, Resource("createAllocation", "Allocation",
                                                {**attrs, "name": f"{body.name}-{index}"}, tags))
        if not decision.allowed:
            raise PolicyDenied(decision)
