"""Tenant clusters as the paas service publishes them: clusters_view, fed by paas.cluster_changed (in the
consumer's transaction, inbox-deduped). A document is applied only when its ``version`` is higher than the one
shown (documents may arrive out of order); it replaces what the gateway marked while it waited (a pending scale,
'deleting'): it is the service's answer, or newer. The row the POST wrote keeps its creation time (a page cursor
stays where it was)."""
from __future__ import annotations

import json

from services.paas import contracts as pc
from shared.unit_of_work import UnitOfWork

from ...adapters.versioned import upsert_newer

_CLUSTER = upsert_newer(
    "clusters_view", ["id"], ["id", "tenant_id", "name", "kind", "shape", "gpu_count", "node_count", "network_id",
                              "state", "reason", "driver", "controller", "nodes", "autoscaling", "spot", "version",
                              "created_at", "updated_at"],
    jsonb={"nodes", "autoscaling"}, same=["tenant_id"], insert_only={"created_at"},
    assign={"pending_node_count": "NULL"})


async def on_cluster_changed(ctx: UnitOfWork, data: pc.ClusterChanged) -> None:
    nodes = json.dumps([n.model_dump(mode="json") for n in data.nodes])
    autoscaling = data.autoscaling.model_dump_json() if data.autoscaling else None
    await ctx.conn.execute(_CLUSTER, data.cluster_id, data.tenant_id, data.name, data.kind, data.shape, data.gpu_count,
                           data.node_count, data.network_id, data.state, data.reason, data.driver, data.controller,
                           nodes, autoscaling, data.spot, data.version, data.created_at, data.updated_at)
