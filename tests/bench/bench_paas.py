"""`./taskw bench:paas` — not a test. A job's submission through Tessera against the same submission made directly to
the tenant's own scheduler, in the same run. Needs root (namespace slots on kernel-dataplane nodes).

A whole platform with two kernel-dataplane nodes (the lab) runs a tenant cluster (`--kind slurm`, the default, or
`ray`) of two namespace slots. Then N jobs (default 40), one after the other, each a trivial command:

- through Tessera: `POST /v1/jobs` sent → `paas.job_changed` carrying the scheduler's job id (Slurm or Ray accepted
  it), seen on the bus: the gateway, the paas service's policy check, its reconciler's pick-up and the driver's
  submission;
- directly: the driver's own submission to the same cluster (Slurm's `slurmrestd` job/submit, Ray's Jobs API), the
  substrate's floor.

Tessera's own overhead is the difference of the two at each percentile (target p95 ≤ 1 s: Armada expects about
10 s from submission to scheduling). The last line is one JSON object with every figure.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid

import asyncpg
import nats

from services.node_agent.adapters.dataplane.lab import UNDERLAY_DEV, Lab
from services.paas.bootstrap import drivers
from services.paas.domain.runtime import ClusterHandle, JobSpec
from services.paas.settings import PaasSettings
from tests.bench.common import pct, report, work_dir
from tests.support.platform import E2E_ENV
from tests.support.polling import eventually
from tooling import paas_state
from tooling.client import TesseraClient
from tooling.platform import Platform

TARGET_OVERHEAD_S = 1.0


def say(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


async def _lab_pool(platform: Platform, lab: Lab) -> dict:
    pool = f"bench-{uuid.uuid4().hex[:6]}"
    async with platform.admin() as admin:
        await admin.define_pool(pool, "spread", {"dedicated": f"{pool}:NoSchedule"})
        for i, ns in enumerate(lab.node_ns):
            env = {"TESSERA_NODE_DATAPLANE": "kernel", "TESSERA_NODE_NETNS": ns, "TESSERA_NODE_UNDERLAY_DEV": UNDERLAY_DEV}
            lab.node_ids.append(uuid.UUID(await platform.add_node(f"{pool}-{i}", env=env, pool=pool)))
    return {"pool": pool, "tolerations": [f"dedicated={pool}:NoSchedule"]}


async def _tenant(platform: Platform, pool: str) -> tuple[TesseraClient, TesseraClient]:
    async with platform.admin() as admin:
        t = await admin.create_tenant(f"bench-{uuid.uuid4().hex[:6]}")
        await admin.set_quota(t["id"], pool, "H100", 8)
        owner = (await admin.create_user(t["id"], "owner", "tenant_admin"))["api_key"]
        user = (await admin.create_user(t["id"], "user", "tenant_user"))["api_key"]
    return await TesseraClient(platform.gateway_url, owner).__aenter__(), \
        await TesseraClient(platform.gateway_url, user).__aenter__()


async def _ready(client: TesseraClient, kind: str, opts: dict) -> dict:
    _, body, _ = await client.request("POST", "/v1/clusters", json_body={
        "name": f"b{uuid.uuid4().hex[:6]}", "kind": kind, "shape": "vm.1gpu", "nodes": 2, **opts}, expect=(202,))

    async def now() -> dict:
        return (await client.request("GET", f"/v1/clusters/{body['id']}"))[1]
    return await eventually(now, timeout=300, interval=0.2, until=lambda c: c["state"] == "ready",
                            fail_if=lambda c: c["state"] == "failed", what="the cluster ready")


def _job_body(kind: str, cluster_id: str, i: int) -> dict:
    program = {"command": ["true"]} if kind == "slurm" else {"entrypoint": "true"}
    return {"cluster_id": cluster_id, "name": f"j{i}", **program}


async def through_tessera(platform: Platform, user: TesseraClient, kind: str, cluster_id: str, n: int) -> list[float]:
    """POST /v1/jobs sent → the job's paas.job_changed naming the scheduler's id, seen on the bus (seconds each)."""
    nc = await nats.connect(platform.nats_url, **platform.connect_options("admin"))
    accepted: dict[str, asyncio.Future] = {}

    async def on_event(msg) -> None:
        data = json.loads(msg.data)["data"]
        fut = accepted.get(data["job_id"])
        if fut is not None and not fut.done() and data.get("external_id"):
            fut.set_result(time.perf_counter())
    sub = await nc.subscribe("paas.evt.job_changed", cb=on_event)
    samples = []
    try:
        for i in range(n + 1):      # the first warms the path (tokens, connections): not counted
            t0 = time.perf_counter()
            _, job, _ = await user.request("POST", "/v1/jobs", json_body=_job_body(kind, cluster_id, i), expect=(202,))
            fut = accepted.setdefault(job["id"], asyncio.get_running_loop().create_future())
            samples.append(await asyncio.wait_for(fut, 60) - t0)
        samples = samples[1:]
    finally:
        await sub.unsubscribe()
        await nc.close()
    return samples


async def directly(platform: Platform, kind: str, cluster_id: str, n: int) -> list[float]:
    """The driver's own submission to the same cluster, timed around the call (seconds each)."""
    conn = await asyncpg.connect(platform.database_url)
    try:
        row = await conn.fetchrow("SELECT handle FROM paas.clusters WHERE id=$1", uuid.UUID(cluster_id))
    finally:
        await conn.close()
    runtime = drivers(PaasSettings(state_dir=str(paas_state.state_dir(platform.workdir))))[kind]
    h = json.loads(row["handle"])
    handle = ClusterHandle(uuid.UUID(h["cluster_id"]), h["controller"], h["api"], h["driver"], h["details"])
    await runtime.submit(handle, JobSpec(job_id=uuid.uuid4(), name="warm", command=("true",)))   # its token minted
    samples = []
    for i in range(n):
        spec = JobSpec(job_id=uuid.uuid4(), name=f"d{i}", command=("true",))
        t0 = time.perf_counter()
        await runtime.submit(handle, spec)
        samples.append(time.perf_counter() - t0)
    return samples


def summary(tessera: list[float], direct: list[float]) -> dict:
    r = {}
    for q, name in ((0.5, "p50"), (0.95, "p95"), (0.99, "p99")):
        r[f"through_tessera_{name}_ms"] = round(pct(tessera, q) * 1000, 1)
        r[f"direct_{name}_ms"] = round(pct(direct, q) * 1000, 1)
        r[f"overhead_{name}_ms"] = round((pct(tessera, q) - pct(direct, q)) * 1000, 1)
    r["through_over_direct_p50"] = round(pct(tessera, 0.5) / pct(direct, 0.5), 1)
    r["overhead_target_p95_ms"] = TARGET_OVERHEAD_S * 1000
    r["overhead_target_met"] = r["overhead_p95_ms"] <= TARGET_OVERHEAD_S * 1000
    return r


async def main(args) -> dict:
    work = work_dir("tessera-bench-paas-")
    say(f"work dir (service logs: logs/): {work}")
    platform = Platform(work, env={**E2E_ENV, "TESSERA_LOG_LEVEL": "WARNING"}, durable=False)
    lab = Lab(2, dataplanes=False)
    await asyncio.to_thread(lab.build)
    lab.node_ids = []
    owner = user = None
    try:
        await platform.start()
        opts = await _lab_pool(platform, lab)
        owner, user = await _tenant(platform, opts["pool"])
        t0 = time.perf_counter()
        cluster = await _ready(owner, args.kind, opts)
        say(f"{args.kind} cluster ready in {time.perf_counter() - t0:.1f} s; {args.jobs} jobs each way")
        tessera = await through_tessera(platform, user, args.kind, cluster["id"], args.jobs)
        direct = await directly(platform, args.kind, cluster["id"], args.jobs)
        result = {"bench": "paas", "kind": args.kind, "jobs": args.jobs, **summary(tessera, direct),
                  "reconcile_s": PaasSettings().reconcile_s, "load_average_1m": os.getloadavg()[0]}
        await owner.request("DELETE", f"/v1/clusters/{cluster['id']}", expect=(202,))
        return result
    finally:
        for c in (owner, user):
            if c is not None:
                await c.__aexit__(None, None, None)
        await platform.stop()
        await asyncio.to_thread(lab.destroy)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", choices=("slurm", "ray"), default="slurm")
    parser.add_argument("--jobs", type=int, default=40)
    report(asyncio.run(main(parser.parse_args())))
