"""A cluster driver that records what the PaaS service asks of it and answers as a scheduler would (for the
service's own tests: the real drivers have theirs, against real Slurm and Ray)."""
from __future__ import annotations

import asyncio
import time
import uuid

from services.paas.domain.runtime import (
    ClusterError,
    ClusterHandle,
    ClusterNode,
    ClusterSpec,
    JobSpec,
    JobStatus,
    NodeUse,
)
from tests.support.bus import publish_event
from tests.support.polling import eventually

SHAPE = "vm.1gpu"


class RecordingRuntime:
    kind = "slurm"

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []
        self.jobs: dict[str, JobStatus] = {}
        self.by_job_id: dict[str, str] = {}
        self.node_states: dict[str, str] = {}
        self.refuse: str | None = None            # a submit refused for good, with this text
        self.refuse_replace: str | None = None    # a lost node that cannot be moved, with this text
        self.started = asyncio.Event()

    def names(self, call: str) -> list:
        return [arg for name, arg in self.calls if name == call]

    async def start(self, spec: ClusterSpec) -> ClusterHandle:
        self.calls.append(("start", spec))
        self.node_states = {n.name: "idle" for n in spec.nodes}
        self.started.set()
        return ClusterHandle(spec.cluster_id, f"{spec.controller.address}:6817", "unix:/nowhere", "slurm",
                             {"nodes": [n.name for n in spec.nodes]})

    async def set_nodes(self, spec: ClusterSpec, handle: ClusterHandle) -> ClusterHandle:
        self.calls.append(("set_nodes", spec))
        self.node_states = {n.name: self.node_states.get(n.name, "idle") for n in spec.nodes}
        return ClusterHandle(handle.cluster_id, handle.controller, handle.api, handle.driver,
                             {"nodes": [n.name for n in spec.nodes]})

    async def replace_node(self, spec: ClusterSpec, handle: ClusterHandle, node: ClusterNode) -> ClusterHandle:
        self.calls.append(("replace_node", node))
        if self.refuse_replace:
            raise ClusterError(self.refuse_replace, permanent=True)
        self.node_states[node.name] = "idle"
        return ClusterHandle(handle.cluster_id, f"{spec.controller.address}:6817", handle.api, handle.driver,
                             {"nodes": [n.name for n in spec.nodes]})

    async def requeue(self, handle: ClusterHandle, external_ids: list[str]) -> list[str]:
        self.calls.append(("requeue", list(external_ids)))
        return list(external_ids)

    async def drain(self, handle: ClusterHandle, node: str, reason: str) -> None:
        self.calls.append(("drain", node))
        if self.node_states.get(node) not in ("drained", "draining"):
            self.node_states[node] = "draining"

    async def nodes(self, handle: ClusterHandle) -> list[NodeUse]:
        return [NodeUse(n, s, 0, 0) for n, s in self.node_states.items()]

    async def stop(self, handle: ClusterHandle) -> None:
        self.calls.append(("stop", handle.cluster_id))

    async def submit(self, handle: ClusterHandle, job: JobSpec) -> str:
        self.calls.append(("submit", job))
        if self.refuse:
            raise ClusterError(self.refuse, permanent=True)
        key = str(job.job_id)
        if key not in self.by_job_id:
            self.by_job_id[key] = str(len(self.by_job_id) + 1)
            self.jobs[self.by_job_id[key]] = JobStatus("PENDING", message="Resources")
        return self.by_job_id[key]

    async def job(self, handle: ClusterHandle, external_id: str) -> JobStatus:
        return self.jobs[external_id]

    async def logs(self, handle: ClusterHandle, external_id: str, limit_bytes: int = 65536) -> str:
        return f"output of job {external_id}\n"[-limit_bytes:]

    async def cancel(self, handle: ClusterHandle, external_id: str) -> None:
        self.calls.append(("cancel", external_id))
        self.jobs[external_id] = JobStatus("CANCELLED", ended_at=time.time(), message="cancelled")

    async def pending(self, handle: ClusterHandle) -> int:
        return sum(1 for s in self.jobs.values() if s.state == "PENDING")

    def finish(self, external_id: str, state: str = "SUCCEEDED", exit_code: int = 0) -> None:
        now = time.time()
        self.jobs[external_id] = JobStatus(state, exit_code, now - 1, now, "", ("n-0", "n-1"))

    def run(self, external_id: str, *nodes: str) -> None:
        self.jobs[external_id] = JobStatus("RUNNING", started_at=time.time(), nodes=tuple(nodes))


def cluster_command(tenant, n=2, **over):
    return {"cluster_id": str(uuid.uuid4()), "tenant_id": str(tenant), "user_id": str(uuid.uuid4()), "name": "train",
            "kind": "slurm", "shape": SHAPE, "gpu_count": 1, "node_count": n, "requested_by": "alice", **over}


def latest(events, cid, kind="paas.cluster_changed", key="cluster_id"):
    seen = [e[1]["data"] for e in events.items if e[1]["type"] == kind and e[1]["data"][key] == str(cid)]
    return max(seen, key=lambda d: d["version"]) if seen else None


async def state_of(events, cid, *states, kind="paas.cluster_changed", key="cluster_id", timeout=20.0):
    return await eventually(lambda: latest(events, cid, kind, key), timeout=timeout,
                            until=lambda d: d is not None and d["state"] in states,
                            what=f"{kind} {cid} in {states}")


async def place_and_activate(js, sched, allocs, cmd, node=None, *, gang: int = 0):
    """Play the scheduler (the tenant's ``gang``-th gang placed), the network (an address each) and the allocations
    (ACTIVE); returns the gang's members."""
    def gangs():
        return [i for i in sched.items if i[1]["type"] == "scheduler.reserve_gang"
                and i[1]["data"]["tenant_id"] == cmd["tenant_id"]]
    g = (await eventually(gangs, timeout=20, until=lambda found: len(found) > gang,
                          what=f"gang {gang} of the tenant"))[gang][1]["data"]
    node = node or uuid.uuid4()
    await publish_event(js, "scheduler.gang_placed", {
        "gang_id": g["gang_id"], "tenant_id": cmd["tenant_id"], "racks": 1, "nvlink_domains": 1,
        "members": [{"allocation_id": a, "node_id": str(node), "slots": [i], "gpu_model": "H100", "pool": "shared"}
                    for i, a in enumerate(g["members"])]}, tenant_id=cmd["tenant_id"])
    requested = await eventually(lambda: [r for r in allocs.items if r[1]["type"] == "allocation.request"
                                          and r[1]["data"]["allocation_id"] in g["members"]],
                                 timeout=20, until=lambda r: len(r) == len(g["members"]), what="every member requested")
    for n, r in enumerate(requested):
        a = r[1]["data"]
        assert a["shape"] == SHAPE and a["labels"]["tessera.cluster"] == cmd["cluster_id"]
        await attach_and_activate(js, cmd, a["allocation_id"], node, f"10.9.{gang}.{10 + n}")
    return g["members"]


async def attach_and_activate(js, cmd, alloc, node, ip):
    saga = uuid.uuid4()
    att = uuid.uuid4()
    await publish_event(js, "network.network_attached", {
        "saga_id": str(saga), "step": "attach_network", "idempotency_key": f"{saga}:attach_network",
        "allocation_id": alloc, "attachment_id": str(att), "vni": 5001, "ip_address": ip,
        "mac_address": "02:00:00:00:00:01", "node_id": str(node),
        "attachment": {"attachment_id": str(att), "allocation_id": alloc, "network_id": str(uuid.uuid4()),
                       "ip_address": ip, "prefix_len": 24, "mac_address": "02:00:00:00:00:01"},
        "tenant_networks": {"tenant_id": cmd["tenant_id"], "version": 1, "networks": []}},
        tenant_id=cmd["tenant_id"])
    await publish_event(js, "allocation.activated", {
        "allocation_id": alloc, "tenant_id": cmd["tenant_id"], "state": "ACTIVE", "at": "2026-11-29T00:00:00Z",
        "saga_id": str(saga), "step": "activate", "idempotency_key": f"{saga}:activate", "node_id": str(node)},
        tenant_id=cmd["tenant_id"])


async def released(js, tenant, alloc):
    await publish_event(js, "allocation.released", {"allocation_id": alloc, "tenant_id": str(tenant),
                                                    "state": "RELEASED", "at": "2026-11-29T00:00:00Z",
                                                    "saga_id": str(uuid.uuid4()), "step": "mark_released",
                                                    "idempotency_key": "x"}, tenant_id=str(tenant))
