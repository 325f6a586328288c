"""An attachment arriving on or leaving its leaf switch: the network's leaf-local VLAN there and the fabric drivers'
calls, in the step's transaction. Shared by the attach and detach steps and by a bare-metal port's binding, which
moves its attachment to the leaf the server is cabled to."""
from __future__ import annotations

import uuid

from shared.participant import StepRejected
from shared.unit_of_work import UnitOfWork

from ..adapters.fabric import FabricChange, FabricDriver
from ..domain.model import Attachment, NetworkPlan
from ..domain.ports import NetworkRepository


async def fabric_change(networks: NetworkRepository, a: Attachment, tenant_id: uuid.UUID, vlan: int) -> FabricChange:
    """The fabric's view of ``a``; call it while ``a`` is not in the table (before the insert, after the delete)."""
    on_network, on_tenant, total = await networks.on_leaf(a.leaf, tenant_id, a.network_id)
    res = await networks.tenant(tenant_id)
    net = next(n for n in await networks.networks_of(tenant_id) if n.id == a.network_id)
    return FabricChange(tenant_id=tenant_id, network_id=net.id, vni=net.vni, cidr=net.cidr, gateway_ip=net.gateway,
                        vrf_table=res.vrf_table, l3_vni=res.l3_vni, pkey=res.pkey, allocation_id=a.allocation_id,
                        guid=a.guid, node_id=a.node_id, leaf=a.leaf, vlan=vlan, network_alone_on_leaf=on_network == 0,
                        tenant_alone_on_leaf=on_tenant == 0, tenant_alone=total == 0)


async def join_leaf(networks: NetworkRepository, a: Attachment, tenant_id: uuid.UUID, *, ctx: UnitOfWork,
                    plan: NetworkPlan, fabric: list[FabricDriver]) -> None:
    """Store the attachment ``a`` (not in the table) on its leaf: the network's VLAN there, the fabric's calls."""
    vlan = await networks.lease(f"vlan:{a.leaf}", plan.vlans, a.network_id)
    if vlan is None:
        raise StepRejected(f"leaf {a.leaf} has no free VLAN for network {a.network_id}")
    change = await fabric_change(networks, a, tenant_id, vlan)
    await networks.add_attachment(a)
    for driver in fabric:
        await driver.apply(ctx.conn, "attach", change)


async def leave_leaf(networks: NetworkRepository, a: Attachment, tenant_id: uuid.UUID, *, ctx: UnitOfWork,
                     fabric: list[FabricDriver]) -> None:
    """Delete the attachment ``a``: its network's VLAN on the leaf goes with the network's last slot there, and the
    fabric config only it needed."""
    await networks.delete_attachment(a.allocation_id)
    if a.leaf:   # attachments from before the fabric existed have no leaf and no VLAN
        vlan = await networks.held(f"vlan:{a.leaf}", a.network_id) or 0
        change = await fabric_change(networks, a, tenant_id, vlan)
        if change.network_alone_on_leaf:
            await networks.release(a.network_id, f"vlan:{a.leaf}")
        for driver in fabric:
            await driver.apply(ctx.conn, "detach", change)
