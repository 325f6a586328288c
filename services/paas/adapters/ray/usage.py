"""The cluster's nodes as Ray sees them, in the words autoscaling and scale-in read (NodeUse). Pure.

A Ray node is known by its address on the tenant network (each node's raylet runs with
``--node-ip-address``); a node restarted at one address leaves a DEAD record beside its ALIVE one, and the
ALIVE one wins. Drained: Ray's raylet exits by itself once a drained node has nothing left to run, so a node
asked to drain reads ``draining`` while alive and ``drained`` once its raylet is gone.
"""
from __future__ import annotations

from ...domain.runtime import NodeUse


def alive_by_address(ray_nodes: list[dict]) -> dict[str, dict]:
    """Address -> the node record of ``GET /api/v0/nodes`` that is ALIVE there (else the last one seen)."""
    found: dict[str, dict] = {}
    for record in ray_nodes:
        address = record.get("node_ip")
        if address and (address not in found or record.get("state") == "ALIVE"):
            found[address] = record
    return found


def _word(alive: bool, draining: bool, gpus_used: float, gpus_total: float, jobs: int) -> str:
    if draining:
        return "draining" if alive else "drained"
    if not alive:
        return "down"
    if not gpus_used and not jobs:
        return "idle"
    return "allocated" if gpus_total and gpus_used >= gpus_total else "mixed"


def node_uses(addresses: dict[str, str], ray_nodes: list[dict], usage_by_node: dict[str, dict], jobs: list[dict],
              drains: set[str]) -> list[NodeUse]:
    """Every node of the cluster (``addresses``: name -> address), in that order.

    ``usage_by_node``: the cluster status's ``usageByNode`` (node id -> resource -> [used, total]);
    ``jobs``: ``GET /api/jobs/`` (a running job counts on the node its driver runs on); ``drains``: the names
    of the nodes asked to drain.
    """
    records = alive_by_address(ray_nodes)
    uses = []
    for name, address in addresses.items():
        record = records.get(address) or {}
        node_id = record.get("node_id", "")
        alive = record.get("state") == "ALIVE"
        used, total = (usage_by_node.get(node_id, {}).get("GPU") or [0.0, 0.0])[:2] if alive else (0.0, 0.0)
        running = sum(1 for j in jobs if j.get("status") == "RUNNING" and j.get("driver_node_id") == node_id) \
            if alive else 0
        uses.append(NodeUse(name=name, state=_word(alive, name in drains, used, total, running),
                            running_jobs=running, gpus_in_use=round(used)))
    return uses
