"""`./taskw up`'s spot offering: a pool of two simulated nodes whose idle GPUs the provider sells as spot.

The first start declares the pool (tainted: only what tolerates it lands there), registers its two nodes, makes
the provider's spot tenant (``spot-market``) with a quota there, grants the demo tenant a quota there too, and
enables the offering: every idle node becomes a spot node, offered to the (recorded) market, and a demo
allocation in the pool takes one back with the offering's notice. Later starts start the same nodes' agents again;
the offering lives on in the database.
"""
from __future__ import annotations

from .platform import Platform

POOL = "spot"
TAINT = {"dedicated": f"{POOL}:NoSchedule"}
TOLERATION = f"dedicated={POOL}:NoSchedule"
NOTICE_S = 30


async def spot_offering(platform: Platform, data: dict) -> None:
    """Start (or, the first time, set up) the spot pool's nodes and offering; records them in ``data``."""
    if data.get("spot_nodes"):
        for node_id in data["spot_nodes"]:
            await platform.start_node_agent(node_id, None)
    else:
        async with platform.admin() as admin:
            await admin.define_pool(POOL, "pack", TAINT)
            market = await admin.create_tenant("spot-market")
            await admin.set_quota(market["id"], POOL, "H100", 16)
            await admin.set_quota(data["tenant_id"], POOL, "H100", 16)
        data["spot_nodes"] = [await platform.add_node(f"demo-spot-{letter}", pool=POOL) for letter in "ab"]
        data["spot_tenant_id"] = market["id"]
        async with platform.admin() as admin:
            await admin.request("PUT", f"/v1/spot-offerings/{POOL}", json_body={
                "tenant_id": market["id"], "shape": "vm.8gpu", "notice_s": NOTICE_S,
                "tolerations": [TOLERATION]}, expect=(202,))
    print(f"Spot demo: pool {POOL} (toleration {TOLERATION}), its idle GPUs offered as spot", flush=True)
