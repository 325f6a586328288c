"""A stored cluster as its driver sees it: the ClusterSpec of its live nodes, the ClusterHandle it was started as."""
from __future__ import annotations

import uuid

from shared.slots import node_tag, slot_netns

from ..domain.clusters import Cluster, Member
from ..domain.runtime import ClusterHandle, ClusterNode, ClusterSpec


def node_of(cl: Cluster, m: Member, *, netns: bool) -> ClusterNode:
    """``netns``: the nodes are namespace slots (the sim node driver with the kernel dataplane): the driver runs
    each daemon in its slot's namespace; else on the node at its address."""
    ns = slot_netns(node_tag(m.node_id), m.attachment_id) if netns and m.node_id and m.attachment_id else None
    return ClusterNode(name=cl.node_name(m), allocation_id=m.allocation_id, address=m.address or "", netns=ns,
                       gpus=cl.gpu_count)


def spec_of(cl: Cluster, members: list[Member], *, netns: bool) -> ClusterSpec:
    ordered = sorted(members, key=lambda m: m.idx)
    return ClusterSpec(cluster_id=cl.id, tenant_id=cl.tenant_id, name=cl.name, kind=cl.kind,
                       nodes=tuple(node_of(cl, m, netns=netns) for m in ordered))


def handle_of(cl: Cluster) -> ClusterHandle:
    h = cl.handle or {}
    return ClusterHandle(cluster_id=uuid.UUID(str(h.get("cluster_id", cl.id))), controller=h.get("controller", ""),
                         api=h.get("api", ""), driver=h.get("driver", cl.kind), details=h.get("details", {}))


def handle_doc(h: ClusterHandle) -> dict:
    return {"cluster_id": str(h.cluster_id), "controller": h.controller, "api": h.api, "driver": h.driver,
            "details": h.details}
