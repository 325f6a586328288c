"""Tenant clusters through the whole platform: a Slurm cluster and a Ray cluster on a tenant's own allocations
(namespace slots on kernel-dataplane nodes, on the tenant's network), jobs through one API, and another tenant that
can neither see, reach nor submit to them.

Two node-agents run with the kernel dataplane in their own "node" namespaces (the lab); each cluster node is an
allocation whose slot namespace holds its address on the tenant network, and the cluster's daemons run there."""
from __future__ import annotations

import asyncio
import os
import subprocess
import uuid

import pytest

from services.node_agent.adapters.dataplane.lab import UNDERLAY_DEV, Lab
from tests.e2e.test_network_isolation import attachment_of, netns_of
from tests.support.polling import eventually

pytestmark = [pytest.mark.timeout(420),
              pytest.mark.skipif(os.geteuid() != 0, reason="kernel networking needs root (namespaces, nftables)")]

FINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "TIMEOUT", "REJECTED"}


@pytest.fixture(scope="module")
async def paas_pool(platform):
    """Two kernel-dataplane nodes in a tainted pool of their own; yields the request options that reach it."""
    lab = Lab(2, dataplanes=False)
    pool = f"paas-{uuid.uuid4().hex[:6]}"
    try:
        await asyncio.to_thread(lab.build)
        async with platform.admin() as admin:
            await admin.define_pool(pool, "spread", {"dedicated": f"{pool}:NoSchedule"})
            ids = []
            for i, ns in enumerate(lab.node_ns):
                env = {"TESSERA_NODE_DATAPLANE": "kernel", "TESSERA_NODE_NETNS": ns,
                       "TESSERA_NODE_UNDERLAY_DEV": UNDERLAY_DEV}
                ids.append(await platform.add_node(f"{pool}-{i}", env=env, pool=pool))
        lab.node_ids = [uuid.UUID(i) for i in ids]
        yield {"pool": pool, "tolerations": [f"dedicated={pool}:NoSchedule"]}
    finally:
        await asyncio.to_thread(lab.destroy)


async def _tenant(make_tenant, platform, pool: str, gpus: int = 8):
    t = await make_tenant()
    async with platform.admin() as admin:
        await admin.set_quota(t.id, pool, "H100", gpus)
    return t


async def _cluster(client, name: str, kind: str, opts: dict, nodes: int = 2, shape: str = "vm.1gpu") -> dict:
    status, body, _ = await client.request("POST", "/v1/clusters", json_body={
        "name": name, "kind": kind, "shape": shape, "nodes": nodes, **opts}, expect=(202,))
    return body


async def _wait_cluster(client, cid: str, states: set[str], timeout: float = 180.0) -> dict:
    async def now():
        return (await client.request("GET", f"/v1/clusters/{cid}"))[1]
    return await eventually(now, timeout=timeout, interval=0.25, until=lambda c: c["state"] in states,
                            fail_if=lambda c: c["state"] == "failed" and "failed" not in states,
                            what=f"cluster {cid} in {states}")


async def _job(client, cluster_id: str, **spec) -> dict:
    status, body, _ = await client.request("POST", "/v1/jobs", json_body={"cluster_id": cluster_id, **spec},
                                           expect=(202,))
    return body


async def _wait_job(client, jid: str, timeout: float = 120.0) -> dict:
    async def now():
        return (await client.request("GET", f"/v1/jobs/{jid}"))[1]
    return await eventually(now, timeout=timeout, interval=0.25, until=lambda j: j["state"] in FINAL,
                            what=f"job {jid} to end")


async def _delete(client, cid: str) -> None:
    """Delete the cluster and wait until it is gone (deleted, or no longer listed)."""
    await client.request("DELETE", f"/v1/clusters/{cid}", expect=(202, 404))

    async def now():
        status, body, _ = await client.request("GET", f"/v1/clusters/{cid}", expect=(200, 404))
        return "deleted" if status == 404 else body["state"]
    await eventually(now, timeout=120, interval=0.25, until=lambda s: s in ("deleted", "failed"),
                     what=f"cluster {cid} deleted")


def _reach(netns: str, address: str, port: int) -> bool:
    """Whether a TCP connection from the namespace ``netns`` to address:port succeeds within 2 s."""
    probe = f"import socket; socket.create_connection(('{address}', {port}), timeout=2)"
    done = subprocess.run(["ip", "netns", "exec", netns, "python3", "-c", probe], capture_output=True, timeout=20)
    return done.returncode == 0


async def test_a_slurm_cluster_runs_a_two_task_gpu_job_and_another_tenant_cannot_see_reach_or_submit(
        platform, make_tenant, paas_pool):
    a = await _tenant(make_tenant, platform, paas_pool["pool"])
    b = await _tenant(make_tenant, platform, paas_pool["pool"])
    cl = await _cluster(a.admin, "hpc", "slurm", paas_pool)
    try:
        ready = await _wait_cluster(a.admin, cl["id"], {"ready"})
        assert ready["driver"] == "slurm" and len(ready["nodes"]) == 2
        job = await _job(a.user, cl["id"], name="hello", tasks=2, gpus_per_task=1,
                         command=["sh", "-c", "echo task=$SLURM_PROCID node=$SLURMD_NODENAME gpu=$CUDA_VISIBLE_DEVICES"])
        done = await _wait_job(a.user, job["id"])
        assert done["state"] == "SUCCEEDED" and done["exit_code"] == 0, done
        logs = (await a.user.request("GET", f"/v1/jobs/{job['id']}/logs"))[1]["logs"]
        assert "task=0" in logs and "task=1" in logs and "node=hpc-0" in logs and "node=hpc-1" in logs
        assert "gpu=0" in logs

        # refused before anything reaches Slurm: by the gateway (more GPUs than the cluster has), or by the paas
        # service's job policy (a privileged run), which shows it on the job
        status, problem, _ = await a.user.request("POST", "/v1/jobs", json_body={
            "cluster_id": cl["id"], "name": "greedy", "command": ["true"], "tasks": 3, "gpus_per_task": 1},
            expect=(422,))
        assert problem["errors"][0]["code"] == "capacity"
        refused = await _wait_job(a.user, (await _job(a.user, cl["id"], name="root", command=["id"],
                                                      privileged=True))["id"])
        assert refused["state"] == "REJECTED" and "privileged" in refused["reason"] and not refused["external_id"]

        # another tenant: nothing to see, nothing to submit to, no route to the controller
        assert (await b.admin.request("GET", f"/v1/clusters/{cl['id']}", expect=(404,)))[0] == 404
        listed = (await b.admin.request("GET", "/v1/clusters"))[1]["items"]
        assert cl["id"] not in [c["id"] for c in listed]
        await b.user.request("POST", "/v1/jobs", json_body={"cluster_id": cl["id"], "name": "sneak",
                                                            "command": ["true"]}, expect=(404,))
        intruder = await b.admin.create_allocation("intruder", "vm.1gpu", **paas_pool)
        intruder = await b.admin.wait_state(intruder["id"], "ACTIVE", timeout=90)
        ns_b = netns_of(await attachment_of(b.admin, intruder))
        controller = ready["controller"].rsplit(":", 1)
        assert not _reach(ns_b, controller[0], int(controller[1]))
    finally:
        await _delete(a.admin, cl["id"])


async def test_a_cluster_that_cannot_fit_whole_waits_holding_no_gpu(platform, make_tenant, paas_pool, db):
    t = await _tenant(make_tenant, platform, paas_pool["pool"], gpus=32)
    cl = await _cluster(t.admin, "toobig", "slurm", paas_pool, nodes=3, shape="vm.8gpu")
    try:
        queued = await _wait_cluster(t.admin, cl["id"], {"queued"}, timeout=60)
        assert "3 node(s) at once" in queued["reason"]
        held = await db.fetchval("SELECT count(*) FROM scheduler.slots WHERE allocation_id = ANY($1::uuid[])",
                                 [n["allocation_id"] for n in queued["nodes"]])
        assert held == 0
    finally:
        await _delete(t.admin, cl["id"])


RAY_FANOUT = ("python -c \"import ray; ray.init(); "
              "where = ray.remote(num_gpus=1)(lambda: ray.util.get_node_ip_address()); "
              "print('ran on', sorted(ray.get([where.remote() for _ in range(2)])))\"")


async def test_a_ray_cluster_runs_a_job_across_its_nodes_through_the_same_api(platform, make_tenant, paas_pool):
    t = await _tenant(make_tenant, platform, paas_pool["pool"])
    cl = await _cluster(t.admin, "rays", "ray", paas_pool)
    try:
        ready = await _wait_cluster(t.admin, cl["id"], {"ready"})
        assert ready["driver"] == "ray" and ready["controller"].endswith(":6379")
        job = await _job(t.user, cl["id"], name="fanout", entrypoint=RAY_FANOUT)
        done = await _wait_job(t.user, job["id"])
        assert done["state"] == "SUCCEEDED" and done["exit_code"] == 0, done
        logs = (await t.user.request("GET", f"/v1/jobs/{job['id']}/logs"))[1]["logs"]
        addresses = sorted(n["address"] for n in ready["nodes"])
        assert f"ran on {addresses!r}" in logs, logs
    finally:
        await _delete(t.admin, cl["id"])
