"""Clusters (Slurm, Ray, Kubernetes over the tenant's allocations) and the jobs that run on them."""
from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Annotated

import typer

from cli.common import Interval, Output, Watch, changed, client, interrupted_quietly, show_list, show_read
from cli.errors import FAILED, USAGE, CliError
from cli.render import Columns, emit

cluster_app = typer.Typer(help="Clusters: Slurm, Ray or Kubernetes over N of your allocations.", no_args_is_help=True)
job_app = typer.Typer(help="Jobs: one API to run work on any of your clusters.", no_args_is_help=True)
APPS = (("cluster", cluster_app), ("job", job_app))
FINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED", "TIMEOUT", "REJECTED"})

CLUSTERS = Columns((("id", "id"), ("name", "name"), ("kind", "kind"), ("shape", "shape"),
                    ("nodes", lambda c: _nodes(c)), ("state", "state"), ("driver", "driver")),
                   (("controller", "controller"), ("addresses", lambda c: [n.get("address") for n in c.get("nodes")
                                                                           or [] if n.get("address")]),
                    ("autoscaling", lambda c: _bounds(c.get("autoscaling"))), ("reason", "reason"),
                    ("created", "created_at")))
JOBS = Columns((("id", "id"), ("name", "name"), ("cluster", "cluster_id"), ("state", "state"),
                ("tasks", "tasks"), ("gpus", lambda j: j["tasks"] * j["gpus_per_task"]), ("exit", "exit_code")),
               (("scheduler-id", "external_id"), ("nodes", "nodes"), ("reason", "reason"),
                ("submitted", "submitted_at"), ("ended", "ended_at")))


def _nodes(c: dict) -> str:
    """Ready nodes out of the count it should have, and the count asked for while a scale is pending."""
    ready = sum(1 for n in c.get("nodes") or [] if n.get("state") == "ready")
    shown = f"{ready}/{c['node_count']}"
    return shown + (f"→{c['requested_node_count']}" if c.get("requested_node_count") else "")


def _bounds(a: dict | None) -> str | None:
    return f"{a['min_nodes']}-{a['max_nodes']}@{a['target_gpu_util']:g}" if a else None


def env_pairs(pairs: list[str]) -> dict[str, str]:
    """``NAME=value`` options as a dict (a value may hold '='); a usage error for one without '='."""
    env = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise CliError(f"--env takes NAME=value, not {pair!r}", USAGE)
        env[name] = value
    return env


def cluster_body(name: str, kind: str, shape: str | None, nodes: int | None, network: str | None, pool: str | None,
                 priority: int, min_nodes: int | None, max_nodes: int | None, target_util: float,
                 cooldown_s: int, tolerations: list[str] | None = None, allocations: list[str] | None = None) -> dict:
    """The POST /v1/clusters body: ``shape`` and ``nodes`` (new allocations), or ``allocations`` the tenant holds,
    exactly one of the two (a usage error otherwise); autoscaling only when both bounds are given (one alone is a
    usage error)."""
    if allocations and (shape is not None or nodes is not None):
        raise CliError("give --shape and --nodes, or --allocation, not both", USAGE)
    if not allocations and (shape is None or nodes is None):
        raise CliError("give --shape and --nodes (new allocations), or --allocation for each one you hold", USAGE)
    body: dict = {"name": name, "kind": kind, "priority": priority}
    body.update({"allocation_ids": list(allocations)} if allocations else {"shape": shape, "nodes": nodes})
    body.update({k: v for k, v in (("network_id", network), ("pool", pool)) if v is not None})
    if tolerations:
        body["tolerations"] = list(tolerations)
    if (min_nodes is None) != (max_nodes is None):
        raise CliError("autoscaling needs both --min-nodes and --max-nodes", USAGE)
    if min_nodes is not None:
        body["autoscaling"] = {"min_nodes": min_nodes, "max_nodes": max_nodes, "target_gpu_util": target_util,
                               "cooldown_s": cooldown_s}
    return body


def job_body(cluster: str, name: str, command: list[str], entrypoint: str | None, tasks: int, gpus_per_task: int,
             time_limit_s: int, env: list[str], image: str | None, privileged: bool) -> dict:
    """The POST /v1/jobs body: ``command`` (the words after ``--``) or ``entrypoint``, exactly one."""
    if bool(command) == (entrypoint is not None):
        raise CliError("give the command after -- or --entrypoint, exactly one", USAGE)
    body: dict = {"cluster_id": cluster, "name": name, "tasks": tasks, "gpus_per_task": gpus_per_task,
                  "time_limit_s": time_limit_s, "env": env_pairs(env), "privileged": privileged}
    body.update({"command": command} if command else {"entrypoint": entrypoint})
    if image is not None:
        body["image"] = image
    return body


# --- clusters -----------------------------------------------------------------------------------------------

@cluster_app.command("create", epilog="Examples: tessera cluster create train --kind slurm --shape vm.8gpu --nodes 4; "
                                       "tessera cluster create mine --kind ray --allocation 5d0b… --allocation 9e1f…")
def cluster_create(name: str,
                   kind: Annotated[str, typer.Option(help="slurm, ray or kubernetes (rendered only).")],
                   shape: Annotated[str | None, typer.Option(help="Every node's shape (tessera shape list).")] = None,
                   nodes: Annotated[int | None, typer.Option(help="How many nodes, 1 to 64.")] = None,
                   allocation: Annotated[list[str] | None, typer.Option(
                       help="Instead of --shape and --nodes: an ACTIVE allocation you hold, made a node (repeatable, "
                            "in node order; the cluster never releases it).")] = None,
                   network: Annotated[str | None, typer.Option(help="A network id of the tenant.")] = None,
                   pool: Annotated[str | None, typer.Option(help="The node pool.")] = None,
                   toleration: Annotated[list[str] | None, typer.Option(
                       help="A taint of the pool its nodes tolerate, key=value:NoSchedule (repeatable).")] = None,
                   priority: Annotated[int, typer.Option(help="-1000 to 1000.")] = 0,
                   min_nodes: Annotated[int | None, typer.Option(help="Autoscaling: the fewest nodes.")] = None,
                   max_nodes: Annotated[int | None, typer.Option(help="Autoscaling: the most nodes.")] = None,
                   target_util: Annotated[float, typer.Option(help="Autoscaling: GPU use to keep under.")] = 0.7,
                   cooldown_s: Annotated[int, typer.Option(help="Autoscaling: seconds between changes.")] = 300,
                   output: Output = "table"):
    """Create a cluster (tenant admin): placing → ready."""
    body = cluster_body(name, kind, shape, nodes, network, pool, priority, min_nodes, max_nodes, target_util,
                        cooldown_s, toleration, allocation)
    c = client().request("POST", "/v1/clusters", body)
    changed(c, f"cluster {c['id']} requested ({c.get('state')})", output, f"follow it: tessera cluster get {c['id']} -w")


@cluster_app.command("list", epilog="Example: tessera cluster list -o wide")
def cluster_list(output: Output = "table", watch: Watch = False, interval: Interval = 2.0):
    """The tenant's clusters."""
    c = client()
    show_list(lambda: c.items("/v1/clusters", limit=100), CLUSTERS, output, watch, interval)


@cluster_app.command("get", epilog="Example: tessera cluster get 5d0b… -o yaml")
def cluster_get(cluster_id: str, output: Output = "table", watch: Watch = False, interval: Interval = 2.0):
    """One cluster, with its nodes and their addresses (-o yaml shows them)."""
    c = client()
    show_read(lambda: c.get(f"/v1/clusters/{cluster_id}"), CLUSTERS, output, watch, interval)


@cluster_app.command("scale", epilog="Example: tessera cluster scale 5d0b… --nodes 6")
def cluster_scale(cluster_id: str, nodes: Annotated[int, typer.Option(help="The node count to move to.")],
                  output: Output = "table"):
    """Grow or shrink a cluster (tenant admin; shrinking drains first)."""
    c = client().request("POST", f"/v1/clusters/{cluster_id}/scale", {"nodes": nodes})
    changed(c, f"cluster {cluster_id} scaling to {nodes} nodes", output)


@cluster_app.command("delete", epilog="Example: tessera cluster delete 5d0b…")
def cluster_delete(cluster_id: str, output: Output = "table"):
    """Delete a cluster and release its allocations (tenant admin); allocations you held before it stay yours."""
    changed(client().request("DELETE", f"/v1/clusters/{cluster_id}"), f"cluster {cluster_id} deleting", output)


# --- jobs ---------------------------------------------------------------------------------------------------

@job_app.command("submit", epilog="Example: tessera job submit 5d0b… train --tasks 8 --gpus-per-task 1 -- python "
                                  "train.py")
def job_submit(cluster_id: str, name: str,
               command: Annotated[list[str] | None, typer.Argument(help="The argv each task runs (after --).")] = None,
               entrypoint: Annotated[str | None, typer.Option(help="A shell line instead (Ray).")] = None,
               tasks: Annotated[int, typer.Option(help="How many tasks.")] = 1,
               gpus_per_task: Annotated[int, typer.Option(help="GPUs each task holds.")] = 0,
               time_limit_s: Annotated[int, typer.Option(help="Seconds before TIMEOUT.")] = 3600,
               env: Annotated[list[str] | None, typer.Option("--env", "-e", help="NAME=value (repeatable).")] = None,
               image: Annotated[str | None, typer.Option(help="The container image (Kubernetes).")] = None,
               privileged: Annotated[bool, typer.Option(help="Run privileged, if policy allows.")] = False,
               output: Output = "table"):
    """Submit a job to a cluster: SUBMITTING → PENDING → RUNNING → SUCCEEDED (or FAILED, …)."""
    body = job_body(cluster_id, name, command or [], entrypoint, tasks, gpus_per_task, time_limit_s, env or [],
                    image, privileged)
    j = client().request("POST", "/v1/jobs", body)
    changed(j, f"job {j['id']} submitted ({j.get('state')})", output, f"follow it: tessera job watch {j['id']}")


@job_app.command("list", epilog="Example: tessera job list --cluster 5d0b…")
def job_list(cluster: Annotated[str | None, typer.Option(help="Only this cluster's jobs.")] = None,
             output: Output = "table", watch: Watch = False, interval: Interval = 2.0):
    """The tenant's jobs, newest first."""
    c = client()
    show_list(lambda: c.items("/v1/jobs", limit=100, cluster_id=cluster), JOBS, output, watch, interval)


@job_app.command("get", epilog="Example: tessera job get 91ab… -o json")
def job_get(job_id: str, output: Output = "table"):
    """One job."""
    show_read(lambda: client().get(f"/v1/jobs/{job_id}"), JOBS, output)


@job_app.command("logs", epilog="Example: tessera job logs 91ab…")
def job_logs(job_id: str, limit_bytes: Annotated[int, typer.Option(help="The last this many bytes.")] = 65536):
    """A job's output so far, read live from its cluster's scheduler."""
    out = client().get(f"/v1/jobs/{job_id}/logs", limit_bytes=limit_bytes)
    if out.get("truncated"):
        print(f"(the last {limit_bytes} bytes)", file=sys.stderr)
    sys.stdout.write(out.get("logs", ""))
    sys.stdout.flush()


@job_app.command("cancel", epilog="Example: tessera job cancel 91ab…")
def job_cancel(job_id: str, output: Output = "table"):
    """Cancel a job (it ends CANCELLED)."""
    changed(client().request("POST", f"/v1/jobs/{job_id}/cancel"), f"job {job_id} cancelling", output)


def follow(read: Callable[[], dict], interval: float, say: Callable[[str], None] = emit,
           sleep: Callable[[float], None] = time.sleep) -> dict:
    """Read the job every ``interval`` seconds, saying each new state, until it ends; returns its last document."""
    last = None
    while True:
        job = read()
        if job["state"] != last:
            last = job["state"]
            say(f"{job['id']} {last}" + (f" ({job['reason']})" if job.get("reason") else ""))
        if last in FINAL:
            return job
        sleep(interval)


@job_app.command("watch", epilog="Example: tessera job watch 91ab… && tessera job logs 91ab…")
def job_watch(job_id: str, interval: Interval = 1.0):
    """Print the job's state as it changes until it ends; exit 0 when it SUCCEEDED, 1 otherwise."""
    c = client()
    with interrupted_quietly():
        job = follow(lambda: c.get(f"/v1/jobs/{job_id}"), interval)
    if job["state"] != "SUCCEEDED":
        raise CliError(f"job {job_id} ended {job['state']}" + (f" (exit code {job['exit_code']})"
                                                                if job.get("exit_code") is not None else ""), FAILED)
