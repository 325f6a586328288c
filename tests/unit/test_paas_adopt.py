"""A cluster made of allocations its tenant already holds: the members as the domain adopts them, and the create
command that carries them."""
from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from services.paas import contracts as c
from services.paas.domain.clusters import Cluster


def cluster(**over) -> Cluster:
    now = datetime.now(UTC)
    fields = dict(id=uuid.uuid4(), tenant_id=uuid.uuid4(), user_id=uuid.uuid4(), name="mine", kind="slurm",
                  shape="vm.1gpu", gpu_count=1, node_count=3, network_id=None, pool=None, priority=0, spot=False,
                  autoscaling=None, state="placing", created_at=now, updated_at=now)
    return Cluster(**{**fields, **over})


def held(n: int) -> list[tuple]:
    return [(uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), f"10.1.0.{10 + i}") for i in range(n)]


def test_adopted_members_are_active_with_their_addresses_in_the_order_given_and_the_cluster_starts():
    cl, nodes = cluster(), held(3)
    members = cl.adopt(nodes)
    assert [(m.allocation_id, m.node_id, m.attachment_id, m.address) for m in members] == nodes
    assert [(m.idx, m.state, m.adopted) for m in members] == [(0, "active", True), (1, "active", True),
                                                               (2, "active", True)]
    assert cl.state == "starting" and cl.all_active
    assert [cl.node_name(m) for m in members] == ["mine-0", "mine-1", "mine-2"]


def test_a_scale_out_adds_a_gang_of_new_members_after_the_adopted_ones_and_scale_in_takes_the_newest():
    cl = cluster()
    cl.adopt(held(2))
    new = cl.add_gang(1)
    assert [(m.idx, m.state, m.adopted) for m in new] == [(2, "placing", False)]
    for m in cl.members:
        m.state = "ready"
    assert [m.idx for m in cl.shrink_to(1)] == [2, 1]     # the adopted node 1 drains too; node 0 never


def test_a_returned_member_is_no_live_node_and_a_cluster_of_returned_nodes_is_gone():
    cl = cluster()
    members = cl.adopt(held(2))
    members[1].state = "returned"
    assert cl.live_members == [members[0]] and not cl.gone
    members[0].state = "returned"
    assert cl.gone


def _command(members: list[dict], node_count: int) -> dict:
    return {"cluster_id": str(uuid.uuid4()), "tenant_id": str(uuid.uuid4()), "user_id": str(uuid.uuid4()),
            "name": "mine", "kind": "ray", "shape": "vm.1gpu", "gpu_count": 1, "node_count": node_count,
            "requested_by": "alice", "members": members}


def test_the_create_command_carries_members_counted_once_each():
    a, b = ({"allocation_id": str(uuid.uuid4()), "node_id": str(uuid.uuid4()), "address": f"10.2.0.{i}"}
            for i in (1, 2))
    cmd = c.CreateCluster.model_validate(_command([a, b], 2))
    assert [m.address for m in cmd.members] == ["10.2.0.1", "10.2.0.2"] and cmd.members[0].attachment_id is None
    assert c.CreateCluster.model_validate(_command([], 4)).members == []
    for members, count in (([a, b], 3), ([a, a], 2)):
        with pytest.raises(ValidationError):
            c.CreateCluster.model_validate(_command(members, count))
