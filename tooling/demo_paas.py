"""`./taskw up`'s PaaS nodes: two kernel-dataplane nodes in a pool of their own, where a tenant's cluster nodes are
namespace slots on its network (the VM lab's guests run a busybox userland that can host neither Slurm nor Ray).

Each start builds the nodes' namespaces afresh (a lab of two "node" namespaces on an underlay bridge) and starts the
same nodes' agents in them; the first start also declares the pool (tainted: nothing else lands there), registers
the two nodes and gives the demo tenant a quota in the pool. Needs root; without it, or when the lab cannot be
built, one line says why and `up` goes on without them.
"""
from __future__ import annotations

import asyncio
import os

from services.node_agent.adapters.dataplane.lab import UNDERLAY_DEV, Lab

from .platform import Platform

POOL = "paas"
TAINT = {"dedicated": f"{POOL}:NoSchedule"}
TOLERATION = f"dedicated={POOL}:NoSchedule"


def _env(ns: str) -> dict[str, str]:
    return {"TESSERA_NODE_DATAPLANE": "kernel", "TESSERA_NODE_NETNS": ns, "TESSERA_NODE_UNDERLAY_DEV": UNDERLAY_DEV}


async def paas_nodes(platform: Platform, data: dict) -> None:
    """Build the lab, start (or, the first time, register) its two nodes; records them in ``data``."""
    if os.geteuid() != 0:
        print("PaaS demo nodes: not started (namespace slots need root)", flush=True)
        return
    lab = Lab(2, dataplanes=False)
    try:
        await asyncio.to_thread(lab.build)      # pyroute2's sync API runs an event loop of its own
    except Exception as exc:  # noqa: BLE001 - whatever the kernel refused: say it, go on without
        print(f"PaaS demo nodes: cannot run here: {str(exc).splitlines()[0][:300]}", flush=True)
        return
    platform.on_stop.insert(0, lab.destroy)
    if data.get("paas_nodes"):
        for node_id, ns in zip(data["paas_nodes"], lab.node_ns):
            await platform.start_node_agent(node_id, _env(ns))
    else:
        async with platform.admin() as admin:
            await admin.define_pool(POOL, "spread", TAINT)
            await admin.set_quota(data["tenant_id"], POOL, "H100", 16)
        data["paas_nodes"] = [await platform.add_node(f"demo-paas-{letter}", env=_env(ns), pool=POOL)
                              for letter, ns in zip("ab", lab.node_ns)]
    print(f"PaaS demo nodes: pool {POOL} (toleration {TOLERATION}), namespace slots in {lab.fabric[:-4]}-*",
          flush=True)
