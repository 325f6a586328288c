"""Allocations: create (and follow its saga), list, get, delete, watch, console and power actions."""
from __future__ import annotations

from typing import Annotated

import typer

from cli.common import Interval, Output, Watch, changed, check_output, client, show_list, show_read
from cli.render import Columns

app = typer.Typer(help="Allocations: GPUs on a node (a VM slice or the whole server).", no_args_is_help=True)

COLUMNS = Columns(
    (("id", "id"), ("name", "name"), ("shape", "shape"), ("state", "state"), ("node", "node_id"),
     ("queue", "queue_position"), ("created", "created_at")),
    (("pool", "pool"), ("priority", "priority_class"), ("spot", "spot"), ("image", "image"),
     ("failed_step", "failed_step"), ("reason", "reason")))

Id = Annotated[str, typer.Argument(help="The allocation's id.")]


def _labels(values: list[str]) -> dict:
    from cli.errors import USAGE, CliError
    out = {}
    for v in values:
        k, sep, val = v.partition("=")
        if not sep:
            raise CliError(f"--label wants KEY=VALUE, not {v!r}", USAGE)
        out[k] = val
    return out


@app.command(epilog="Example: tessera alloc create train-1 --shape vm.2gpu --volume-gb 100 --wait")
def create(name: str,
           shape: Annotated[str, typer.Option(help="A shape of `tessera shape list`.")],
           volume_gb: Annotated[int, typer.Option(help="Scratch volume size in GB.")] = 0,
           image: Annotated[str | None, typer.Option(help="Image name (default: the provider's default).")] = None,
           network: Annotated[str | None, typer.Option(help="Network id to attach to.")] = None,
           pool: Annotated[str | None, typer.Option()] = None,
           toleration: Annotated[list[str], typer.Option(help="KEY=VALUE:NoSchedule, a taint of the pool to "
                                                              "tolerate (repeatable).")] = [],  # noqa: B006
           priority_class: Annotated[str | None, typer.Option()] = None,
           spot: Annotated[bool, typer.Option(help="Run as spot (may be preempted).")] = False,
           ssh_key: Annotated[list[str], typer.Option(help="Name of a stored SSH key (repeatable).")] = [],  # noqa: B006
           label: Annotated[list[str], typer.Option(help="KEY=VALUE (repeatable).")] = [],  # noqa: B006
           fail_fast: Annotated[bool, typer.Option(help="Fail instead of queueing when there is no room.")] = False,
           wait: Annotated[bool, typer.Option(help="Follow the saga live until ACTIVE or FAILED.")] = False,
           output: Output = "table"):
    """Request an allocation. It is created asynchronously: follow it with --wait or `tessera alloc watch ID`."""
    body = {"name": name, "shape": shape, "volume_gb": volume_gb, "labels": _labels(label), "spot": spot,
            "fail_fast": fail_fast}
    body.update({k: v for k, v in (("image", image), ("network_id", network), ("pool", pool),
                                   ("priority_class", priority_class)) if v})
    if ssh_key:
        body["key_names"] = ssh_key
    if toleration:
        body["tolerations"] = toleration
    c = client()
    a = c.request("POST", "/v1/allocations", body)
    if wait:
        from cli.saga_view import follow
        raise typer.Exit(follow(c, a["id"]))
    changed(a, f"allocation {a['id']} requested ({a['state']})", output,
            f"follow it: tessera alloc watch {a['id']}")


@app.command("list", epilog="Example: tessera alloc list -o wide --watch")
def list_(output: Output = "table", watch: Watch = False, interval: Interval = 2.0):
    """The tenant's allocations (--watch: woken by the tenant's event feed; polls when there is none)."""
    c = client()
    if watch:
        check_output(output)
        from cli.alloc_feed import watch_allocations
        from cli.common import interrupted_quietly
        with interrupted_quietly():
            watch_allocations(c, COLUMNS, output, interval)
        return
    show_list(lambda: c.items("/v1/allocations", limit=100), COLUMNS, output)


@app.command(epilog="Example: tessera alloc get 3f2a… -o yaml")
def get(allocation_id: Id, output: Output = "table", watch: Watch = False, interval: Interval = 2.0):
    """One allocation."""
    c = client()
    show_read(lambda: c.get(f"/v1/allocations/{allocation_id}"), COLUMNS, output, watch, interval)


@app.command(epilog="Example: tessera alloc delete 3f2a…")
def delete(allocation_id: Id, output: Output = "table"):
    """Release an allocation (RELEASING → RELEASED; the node's slots are wiped)."""
    a = client().request("DELETE", f"/v1/allocations/{allocation_id}")
    changed(a, f"allocation {allocation_id} releasing", output, f"follow it: tessera alloc watch {allocation_id}")


@app.command(epilog="Example: tessera alloc watch 3f2a…")
def watch(allocation_id: Id):
    """Follow an allocation's saga live (again): steps, queue position, state. Ctrl-C only stops watching."""
    from cli.saga_view import follow
    raise typer.Exit(follow(client(), allocation_id))


@app.command(epilog="Example: tessera alloc console 3f2a… --tail 200 --follow")
def console(allocation_id: Id, tail: Annotated[int, typer.Option(help="Bytes from the end.")] = 2000,
            follow: Annotated[bool, typer.Option(help="Keep printing what the guest writes.")] = False):
    """The guest's serial console (VM slices)."""
    import sys

    from cli.common import interrupted_quietly
    c = client()
    path = f"/v1/allocations/{allocation_id}/console"
    if not follow:
        sys.stdout.write(c.text(path, {"tail": tail}))
        return
    with interrupted_quietly():
        for text in c.lines(path, {"tail": tail, "follow": "true"}):
            sys.stdout.write(text)
            sys.stdout.flush()


def _action(allocation_id: str, action: str, output: str) -> None:
    r = client().request("POST", f"/v1/allocations/{allocation_id}/actions/{action}")
    changed(r, f"allocation {allocation_id}: {action} requested", output,
            f"follow it: tessera alloc watch {allocation_id}")


@app.command(epilog="Example: tessera alloc reboot 3f2a…")
def reboot(allocation_id: Id, output: Output = "table"):
    """Reboot the guest (or the server)."""
    _action(allocation_id, "reboot", output)


@app.command(epilog="Example: tessera alloc stop 3f2a…")
def stop(allocation_id: Id, output: Output = "table"):
    """Power the guest off (the allocation keeps its GPUs)."""
    _action(allocation_id, "stop", output)


@app.command(epilog="Example: tessera alloc start 3f2a…")
def start(allocation_id: Id, output: Output = "table"):
    """Power the guest on again."""
    _action(allocation_id, "start", output)
