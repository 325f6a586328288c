"""A cluster over allocations the tenant already holds (``allocation_ids`` instead of ``shape`` and ``nodes``): each
is checked here, against the gateway's views, before anything is sent, and the create command carries what the
paas service needs to start the cluster on them (node, attachment, address), so it rediscovers nothing.

The rules, each a problem naming the allocation (``errors[].field`` is ``allocation_ids.<index>``), checked in
this order so that ids a client made up are a 404 whatever else is wrong:
1. the tenant's own allocation (404, as another tenant's allocation is everywhere);
2. ACTIVE (409 ``allocation-not-active``): a node must run to host the cluster's daemons;
3. not spot (409 ``allocation-is-spot``): a cluster made here is not spot, and a spot allocation can be taken back
   at any time;
4. attached to a tenant network with an address (409 ``allocation-not-attached``), all to the same one, and to
   ``network_id`` when it is given (409 ``allocations-on-different-networks``): the cluster's daemons talk over it;
5. all of the same shape (409 ``allocations-of-different-shapes``): the cluster has one shape, which a scale-out
   places more of;
6. not a node of a live cluster (409 ``allocation-in-cluster``): one scheduler per node.
No quota, spend cap or allocation policy is judged: nothing new is allocated (a scale-out later is judged as
any). The cluster's pool is ``pool`` when given, else the allocations' own when they share one.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

import asyncpg

from services.paas.contracts import AdoptedMember

from ...adapters.paas import ENDED_CLUSTER
from ...http.problems import ProblemError
from ...http.schema_base import FieldError

ENDED_NODE = ("released", "failed", "returned")
_HELD = """
SELECT a.id, a.state, a.shape, a.gpu_count, a.spot, a.pool, a.labels->>'tessera.cluster' AS made_for,
       n.network_id, n.attachment_id, host(n.ip_address) AS address, coalesce(n.node_id, a.node_id) AS node_id
FROM allocations_view a
LEFT JOIN network_attachments_view n ON n.allocation_id = a.id AND n.detached_at IS NULL
WHERE a.id = ANY($1::uuid[]) AND a.tenant_id = $2"""
# a live cluster holding any of them: by the nodes its last document named (still live there), or, before any
# document, by the cluster label its own allocations carry
_IN_CLUSTER = """
SELECT c.id, n->>'allocation_id' AS allocation_id FROM clusters_view c, jsonb_array_elements(c.nodes) n
WHERE c.tenant_id = $1 AND c.state <> ALL($3::text[]) AND n->>'allocation_id' = ANY($2::text[])
  AND coalesce(n->>'state', '') <> ALL($4::text[])
UNION ALL
SELECT c.id, x.allocation_id FROM clusters_view c
JOIN unnest($5::text[], $2::text[]) AS x(cluster_id, allocation_id) ON c.id::text = x.cluster_id
WHERE c.tenant_id = $1 AND c.state <> ALL($3::text[])"""


@dataclass(frozen=True)
class Held:
    """What the allocations make of the cluster: its shape, network and pool, and the members to send."""

    shape: str
    gpu_count: int
    network_id: uuid.UUID
    pool: str | None
    members: list[AdoptedMember]


def _refuse(status: int, slug: str, index: int, message: str) -> ProblemError:
    return ProblemError(status, message, slug=slug,
                        errors=[FieldError(field=f"allocation_ids.{index}", message=message, code=slug)])


async def held_allocations(conn: asyncpg.Connection, tenant_id: uuid.UUID, ids: list[uuid.UUID],
                           network_id: uuid.UUID | None) -> Held:
    """The checked allocations, in the order given; raises the first rule broken (the module's list)."""
    rows = {r["id"]: r for r in await conn.fetch(_HELD, ids, tenant_id)}
    for i, a in enumerate(ids):
        if a not in rows:
            raise _refuse(404, "not-found", i, f"no such allocation {a}")
    first = rows[ids[0]]
    want_network = network_id or first["network_id"]
    for i, a in enumerate(ids):
        _check(rows[a], i, first, want_network)
    await _not_in_cluster(conn, tenant_id, ids, rows)
    pools = {rows[a]["pool"] for a in ids}
    return Held(first["shape"], first["gpu_count"], want_network, pools.pop() if len(pools) == 1 else None,
                [AdoptedMember(allocation_id=a, node_id=rows[a]["node_id"], attachment_id=rows[a]["attachment_id"],
                               address=rows[a]["address"]) for a in ids])


def _check(row: asyncpg.Record, i: int, first: asyncpg.Record, network_id: uuid.UUID | None) -> None:
    a = row["id"]
    if row["state"] != "ACTIVE":
        raise _refuse(409, "allocation-not-active", i,
                      f"allocation {a} is {row['state']}: only an ACTIVE allocation can be a cluster's node")
    if row["spot"]:
        raise _refuse(409, "allocation-is-spot", i, f"allocation {a} is spot: it can be taken back at any time, "
                                                    "and the cluster is not spot")
    if row["address"] is None or row["node_id"] is None:
        raise _refuse(409, "allocation-not-attached", i,
                      f"allocation {a} has no address on a tenant network (yet)")
    if row["network_id"] != network_id:
        raise _refuse(409, "allocations-on-different-networks", i,
                      f"allocation {a} is on network {row['network_id']}, not {network_id}: a cluster's nodes "
                      "share one tenant network")
    if row["shape"] != first["shape"]:
        raise _refuse(409, "allocations-of-different-shapes", i,
                      f"allocation {a} is a {row['shape']}, not a {first['shape']}: a cluster has one shape")


async def _not_in_cluster(conn: asyncpg.Connection, tenant_id: uuid.UUID, ids: list[uuid.UUID],
                          rows: dict) -> None:
    made_for = [rows[a]["made_for"] or "" for a in ids]
    found = await conn.fetch(_IN_CLUSTER, tenant_id, [str(a) for a in ids], list(ENDED_CLUSTER), list(ENDED_NODE),
                             made_for)
    if found:
        taken = {r["allocation_id"]: r["id"] for r in found}
        i = next(i for i, a in enumerate(ids) if str(a) in taken)
        raise _refuse(409, "allocation-in-cluster", i,
                      f"allocation {ids[i]} is a node of cluster {taken[str(ids[i])]}; leave it first")


def adopted_nodes(name: str, held: Held) -> list[dict]:
    """The nodes the cluster shows until the paas service's first document: as it will make them."""
    return [{"name": f"{name}-{i}", "allocation_id": m.allocation_id, "state": "active", "address": m.address,
             "adopted": True} for i, m in enumerate(held.members)]


async def show_nodes(conn: asyncpg.Connection, cluster_id: uuid.UUID, nodes: list[dict]) -> None:
    """Write the nodes on the requested cluster's row: a second cluster asking for them meanwhile sees them taken."""
    await conn.execute("UPDATE clusters_view SET nodes=$2::jsonb WHERE id=$1", cluster_id,
                       json.dumps(nodes, default=str))
