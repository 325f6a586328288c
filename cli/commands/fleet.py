"""Operator verbs for the fleet: nodes (onboarding, cordon, drain, health), shapes and pools."""
from __future__ import annotations

from typing import Annotated

import typer

from cli.common import Interval, Output, Watch, changed, client, show_list, show_one, show_read
from cli.render import Columns

node_app = typer.Typer(help="Nodes (provider admin): onboarding, cordon, drain, health.", no_args_is_help=True)
shape_app = typer.Typer(help="Shapes: what an allocation asks for.", no_args_is_help=True)
pool_app = typer.Typer(help="Pools (provider admin): placement policy and taints.", no_args_is_help=True)
spot_app = typer.Typer(help="Spot offerings (provider admin): a pool's idle GPUs sold on the spot market.",
                       no_args_is_help=True)

FLEET = Columns((("id", "id"), ("name", "name"), ("model", "gpu_model"), ("status", "status"), ("health", "health"),
                 ("gpus", "gpu_count"), ("free", "gpus.free"), ("allocated", "gpus.allocated"),
                 ("other", "gpus.other")),
                (("pool", "pool"), ("cordoned", "cordoned"), ("draining", "draining"), ("alerts", "alerts"),
                 ("quarantined", "gpus.quarantined")))
HEALTH = Columns((("node", "node_id"), ("name", "name"), ("state", "state"), ("since", "since"),
                  ("last_seen", "last_seen"), ("alerts", lambda h: len(h.get("alerts") or []))),
                 (("cordoned_by", "cordoned_by"), ("draining", "draining"), ("breaker", "breaker_open")),
                 key="node_id")
SHAPES = Columns((("name", "name"), ("kind", "kind"), ("gpus", "gpu_count"), ("model", "gpu_model"),
                  ("mig", "mig_profile")), (("deleted", "deleted"), ("version", "version")), key="name")
POOLS = Columns((("name", "name"), ("policy", "policy"), ("taints", "taints")),
                (("description", "description"), ("version", "version")), key="name")


def gpu_states(detail: dict) -> dict:
    """A node's GPUs by state: free (schedulable slots no allocation holds), quarantined (failed wipes),
    allocated (the rest, while schedulable) and other (every GPU of a node that is not schedulable, e.g.
    burning in or cordoned, less the quarantined)."""
    total = int(detail.get("gpu_count") or 0)
    quarantined = len(detail.get("quarantined") or [])
    free = int(detail.get("free_slots") or 0)
    if detail.get("status") == "schedulable" and not detail.get("cordoned"):
        allocated = max(total - free - quarantined, 0)
        return {"free": free, "allocated": allocated, "quarantined": quarantined, "other": quarantined}
    return {"free": 0, "allocated": 0, "quarantined": quarantined, "other": total}


def fleet(c) -> list[dict]:
    """Each node's document with its GPUs by state and its health (one read per node: the list carries
    neither)."""
    health = {h["node_id"]: h for h in c.items("/v1/health/nodes")}
    out = []
    for n in c.items("/v1/nodes"):
        d = {**n, **c.get(f"/v1/nodes/{n['id']}")}
        h = health.get(n["id"], {})
        d.update(gpus=gpu_states(d), health=h.get("state"), draining=h.get("draining"), alerts=h.get("alerts"))
        out.append(d)
    return out


@node_app.command("register", epilog="Example: tessera node register gpu-17 --gpu-model H100 --gpu-count 8")
def register(name: str, gpu_model: Annotated[str, typer.Option()], gpu_count: Annotated[int, typer.Option()],
             pool: Annotated[str | None, typer.Option()] = None, output: Output = "table"):
    """Register a node; its agent then discovers it and proposes a slot map to approve."""
    n = client().request("POST", "/v1/nodes", {"name": name, "gpu_model": gpu_model, "gpu_count": gpu_count,
                                               **({"pool": pool} if pool else {})})
    changed(n, f"node {n['id']} registering", output, f"approve it: tessera node approve {n['id']}")


@node_app.command("approve", epilog="Example: tessera node approve 9e4d…")
def approve(node_id: str, proposal: Annotated[int | None, typer.Option(help="Default: the node's proposal.")] = None,
            wipe_policy: Annotated[str | None, typer.Option()] = None, output: Output = "table"):
    """Approve the node's proposed slot map (burn-in follows, then it is schedulable)."""
    c = client()
    if proposal is None:
        node = c.get(f"/v1/nodes/{node_id}")
        proposal = node.get("proposal")
        if proposal is None:   # else the API refuses a null proposal as a bad field, which misleads
            from cli.errors import CONFLICT, CliError
            raise CliError(f"node {node_id} has no slot map to approve (status {node.get('status')}): its agent "
                           "proposes one once it has discovered the node", CONFLICT)
    body = {"proposal": proposal, **({"wipe_policy": wipe_policy} if wipe_policy else {})}
    changed(c.request("POST", f"/v1/nodes/{node_id}/approve", body), f"node {node_id} approved", output)


def _post(node_id: str, verb: str, body: dict | None, output: str) -> None:
    changed(client().request("POST", f"/v1/nodes/{node_id}/{verb}", body), f"node {node_id}: {verb} requested", output,
            f"follow it: tessera node get {node_id} -w")


@node_app.command("cordon", epilog="Example: tessera node cordon 9e4d…")
def cordon(node_id: str, output: Output = "table"):
    """Place nothing new on the node."""
    _post(node_id, "cordon", None, output)


@node_app.command("uncordon", epilog="Example: tessera node uncordon 9e4d…")
def uncordon(node_id: str, output: Output = "table"):
    """Place on the node again."""
    _post(node_id, "uncordon", None, output)


@node_app.command("drain", epilog="Example: tessera node drain 9e4d… --reason 'PSU swap'")
def drain(node_id: str, mode: Annotated[str | None, typer.Option(help="How allocations leave.")] = None,
          deadline: Annotated[str | None, typer.Option(help="ISO date-time.")] = None,
          reason: Annotated[str | None, typer.Option()] = None, output: Output = "table"):
    """Cordon the node and move its allocations elsewhere."""
    body = {k: v for k, v in (("mode", mode), ("deadline", deadline), ("reason", reason)) if v}
    _post(node_id, "drain", body, output)


@node_app.command("undrain", epilog="Example: tessera node undrain 9e4d…")
def undrain(node_id: str, output: Output = "table"):
    """End a drain with the cordon it set: the node takes new allocations again (those moved away stay moved)."""
    _post(node_id, "undrain", None, output)


@node_app.command("list", epilog="Example: tessera node list -o wide")
def node_list(output: Output = "table", watch: Watch = False, interval: Interval = 2.0):
    """The fleet: every node with its GPUs by state (free, allocated, other) and its health."""
    c = client()
    show_list(lambda: fleet(c), FLEET, output, watch, interval)


@node_app.command("get", epilog="Example: tessera node get 9e4d… -o yaml")
def node_get(node_id: str, output: Output = "table", watch: Watch = False, interval: Interval = 2.0):
    """One node's document (slot maps, burn-in, BMC, quarantine: -o yaml)."""
    c = client()

    def read() -> dict:
        d = c.get(f"/v1/nodes/{node_id}")
        return {**d, "gpus": gpu_states(d)}
    show_read(read, FLEET, output, watch, interval)


@node_app.command("health", epilog="Example: tessera node health 9e4d…   (no id: the whole fleet)")
def node_health(node_id: Annotated[str | None, typer.Argument()] = None, output: Output = "table",
                watch: Watch = False, interval: Interval = 2.0):
    """Heartbeat and GPU health: one node's (with its alerts), or the fleet's."""
    c = client()
    if node_id:
        show_one(c.get(f"/v1/nodes/{node_id}/health"), HEALTH, output)
    else:
        show_list(lambda: c.items("/v1/health/nodes"), HEALTH, output, watch, interval)


@shape_app.command("list", epilog="Example: tessera shape list")
def shape_list(output: Output = "table", watch: Watch = False, interval: Interval = 2.0):
    """The shapes an allocation can ask for."""
    c = client()
    show_list(lambda: c.items("/v1/shapes"), SHAPES, output, watch, interval)


@shape_app.command("set", epilog="Example: tessera shape set vm.4gpu --kind vm --gpu-count 4 --gpu-model H100")
def shape_set(name: str, kind: Annotated[str, typer.Option(help="vm, bare_metal or mig.")],
              gpu_count: Annotated[int, typer.Option()], gpu_model: Annotated[str | None, typer.Option()] = None,
              mig_profile: Annotated[str | None, typer.Option()] = None, output: Output = "table"):
    """Define (or redefine) a shape (provider admin)."""
    body = {"kind": kind, "gpu_count": gpu_count, "gpu_model": gpu_model, "mig_profile": mig_profile}
    changed(client().request("PUT", f"/v1/shapes/{name}", body), f"shape {name} set", output)


@shape_app.command("delete", epilog="Example: tessera shape delete vm.4gpu")
def shape_delete(name: str, output: Output = "table"):
    """Retire a shape (409 while allocations use it)."""
    changed(client().request("DELETE", f"/v1/shapes/{name}"), f"shape {name} deleting", output)


@pool_app.command("list", epilog="Example: tessera pool list")
def pool_list(output: Output = "table", watch: Watch = False, interval: Interval = 2.0):
    """The pools and their placement policy."""
    c = client()
    show_list(lambda: c.items("/v1/pools"), POOLS, output, watch, interval)


def _taints(values: list[str]) -> dict[str, str]:
    """``KEY=VALUE`` → {KEY: "VALUE:NoSchedule"}: the API takes the effect with the value, and NoSchedule is the
    only one, so it is added when left out."""
    from cli.errors import USAGE, CliError
    out = {}
    for t in values:
        key, sep, value = t.partition("=")
        if not sep or not key:
            raise CliError(f"--taint wants KEY=VALUE, not {t!r}", USAGE)
        out[key] = value if value.endswith(":NoSchedule") else f"{value}:NoSchedule"
    return out


@pool_app.command("set", epilog="Example: tessera pool set training --policy spread --taint dedicated=ml")
def pool_set(name: str, policy: Annotated[str, typer.Option(help="pack or spread.")] = "pack",
             taint: Annotated[list[str], typer.Option(help="KEY=VALUE (repeatable).")] = [],  # noqa: B006
             description: Annotated[str, typer.Option()] = "", output: Output = "table"):
    """Define (or redefine) a pool."""
    body = {"policy": policy, "taints": _taints(taint), "description": description}
    changed(client().request("PUT", f"/v1/pools/{name}", body), f"pool {name} set", output)


SPOT = Columns((("pool", "pool"), ("enabled", "enabled"), ("shape", "shape"), ("offered_gpus", "offered_gpus"),
                ("nodes", lambda d: sum(n["state"] in ("requested", "offered", "reclaiming") for n in d["nodes"])),
                ("reclaiming", lambda d: sum(n["state"] == "reclaiming" for n in d["nodes"])),
                ("free", "free_gpus"), ("reserve", "reserve_gpus")),
               (("tenant", "tenant_id"), ("notice_s", "notice_s"), ("headroom", "headroom_gpus"),
                ("max_nodes", "max_nodes"), ("gpu_hours", lambda d: round(d["offered_gpu_s"] / 3600, 3)),
                ("reclaims", "reclaims_total"), ("market", "cluster_name"), ("driver", "driver"),
                ("reason", "reason")), key="pool")


@spot_app.command("list", epilog="Example: tessera spot list -w")
def spot_list(output: Output = "table", watch: Watch = False, interval: Interval = 2.0):
    """Every pool's spot offering: what it holds and offers, and the pool's free GPUs and reserve."""
    c = client()
    show_list(lambda: c.items("/v1/spot-offerings"), SPOT, output, watch, interval)


@spot_app.command("get", epilog="Example: tessera spot get shared")
def spot_get(pool: str, output: Output = "table", watch: Watch = False, interval: Interval = 2.0):
    """One pool's spot offering, its nodes included in json/yaml."""
    c = client()
    show_read(lambda: c.get(f"/v1/spot-offerings/{pool}"), SPOT, output, watch, interval)


@spot_app.command("enable", epilog="Example: tessera spot enable shared --tenant 3f1c… --shape vm.8gpu --notice 30")
def spot_enable(pool: str, tenant: Annotated[str, typer.Option(help="The provider's tenant holding the spot nodes.")],
                shape: Annotated[str, typer.Option(help="Each spot node's shape.")],
                notice: Annotated[int, typer.Option(help="Seconds of notice a reclaim gives.")] = 30,
                headroom: Annotated[int, typer.Option(help="GPUs kept free beyond every claim.")] = 0,
                max_nodes: Annotated[int, typer.Option()] = 64,
                toleration: Annotated[list[str], typer.Option(help="A taint of the pool to tolerate.")] = [],  # noqa: B006
                output: Output = "table"):
    """Hold the pool's idle GPUs as spot and offer them; taken back with notice when tenants need them."""
    body = {"tenant_id": tenant, "shape": shape, "notice_s": notice, "headroom_gpus": headroom,
            "max_nodes": max_nodes, "tolerations": toleration}
    changed(client().request("PUT", f"/v1/spot-offerings/{pool}", body), f"spot offering of pool {pool} enabled",
            output, f"follow it: tessera spot get {pool} -w")


@spot_app.command("disable", epilog="Example: tessera spot disable shared")
def spot_disable(pool: str, output: Output = "table"):
    """Take every spot node back (with notice) and leave the market."""
    changed(client().request("DELETE", f"/v1/spot-offerings/{pool}"),
            f"spot offering of pool {pool} disabling", output, f"follow it: tessera spot get {pool} -w")


APPS = (("node", node_app), ("shape", shape_app), ("pool", pool_app), ("spot", spot_app))
