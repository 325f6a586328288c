"""Networks (with their rules and attachments) and volumes."""
from __future__ import annotations

from typing import Annotated

import typer

from cli.common import Interval, Output, Watch, changed, client, show_list, show_read
from cli.render import Columns

network_app = typer.Typer(help="Tenant networks: isolated L2/L3 with rules.", no_args_is_help=True)
rule_app = typer.Typer(help="A network's rules.", no_args_is_help=True)
network_app.add_typer(rule_app, name="rule")
volume_app = typer.Typer(help="Volumes: quota'd storage mounted into allocations.", no_args_is_help=True)
APPS = (("network", network_app), ("volume", volume_app))

NETWORKS = Columns((("id", "id"), ("name", "name"), ("cidr", "cidr"), ("state", "state"), ("gateway", "gateway_ip")),
                   (("nat", "nat_address"), ("rules", lambda n: len(n.get("rules") or [])), ("reason", "reason"),
                    ("created", "created_at")))
ATTACHMENTS = Columns((("allocation", "allocation_id"), ("node", "node_id"), ("address", "ip_address"),
                       ("mac", "mac_address"), ("attached", "attached_at")),
                      key="allocation_id")
VOLUMES = Columns((("id", "id"), ("name", "name"), ("class", "storage_class"), ("size", "size_bytes"),
                   ("used", "used_bytes"), ("state", "state")),
                  (("shared", "shared"), ("attachments", lambda v: [a.get("allocation_id") for a in
                                                                     v.get("attachments") or []]),
                   ("mount", "mount_point"), ("reason", "reason")))


@network_app.command(epilog="Example: tessera network create lab --cidr 10.20.0.0/24")
def create(name: str, cidr: Annotated[str, typer.Option(help="The network's IPv4 range.")], output: Output = "table"):
    """Create a network (asynchronously: its state goes creating → active)."""
    n = client().request("POST", "/v1/networks", {"name": name, "cidr": cidr})
    changed(n, f"network {n['id']} requested ({n.get('state')})", output, f"follow it: tessera network get {n['id']} -w")


@network_app.command("list", epilog="Example: tessera network list -o wide")
def list_(output: Output = "table", watch: Watch = False, interval: Interval = 2.0):
    """The tenant's networks."""
    c = client()
    show_list(lambda: c.items("/v1/networks"), NETWORKS, output, watch, interval)


@network_app.command(epilog="Example: tessera network get 7c1e… -o yaml")
def get(network_id: str, output: Output = "table", watch: Watch = False, interval: Interval = 2.0):
    """One network, with its rules (-o yaml shows them)."""
    c = client()
    show_read(lambda: c.get(f"/v1/networks/{network_id}"), NETWORKS, output, watch, interval)


@network_app.command(epilog="Example: tessera network delete 7c1e…")
def delete(network_id: str, output: Output = "table"):
    """Delete a network (refused with 409 while allocations are attached)."""
    r = client().request("DELETE", f"/v1/networks/{network_id}")
    changed(r, f"network {network_id} deleting", output)


@network_app.command(epilog="Example: tessera network attachments 7c1e…")
def attachments(network_id: str, output: Output = "table", watch: Watch = False, interval: Interval = 2.0):
    """The allocations attached to a network."""
    c = client()
    show_list(lambda: c.items(f"/v1/networks/{network_id}/attachments"), ATTACHMENTS, output, watch, interval)


@rule_app.command("add", epilog="Example: tessera network rule add 7c1e… --direction ingress --protocol tcp --port 22")
def rule_add(network_id: str,
             direction: Annotated[str, typer.Option(help="ingress or egress.")],
             protocol: Annotated[str, typer.Option(help="tcp, udp, icmp or any.")] = "tcp",
             port: Annotated[int | None, typer.Option(help="First (or only) port.")] = None,
             port_to: Annotated[int | None, typer.Option(help="Last port of a range.")] = None,
             remote_cidr: Annotated[str | None, typer.Option()] = None,
             remote_network: Annotated[str | None, typer.Option()] = None,
             output: Output = "table"):
    """Add a rule to a network."""
    body = {"direction": direction, "protocol": protocol, "port_from": port, "port_to": port_to or port,
            "remote_cidr": remote_cidr, "remote_network_id": remote_network}
    r = client().request("POST", f"/v1/networks/{network_id}/rules", {k: v for k, v in body.items() if v is not None})
    rid = (r or {}).get("id") or (r or {}).get("rule_id") if isinstance(r, dict) else None
    changed(r, f"rule {rid} added to network {network_id}", output)


@rule_app.command("delete", epilog="Example: tessera network rule delete 7c1e… 91ab…")
def rule_delete(network_id: str, rule_id: str, output: Output = "table"):
    """Remove a rule from a network."""
    r = client().request("DELETE", f"/v1/networks/{network_id}/rules/{rule_id}")
    changed(r, f"rule {rule_id} removed from network {network_id}", output)


@volume_app.command("create", epilog="Example: tessera volume create data --size-gb 50")
def volume_create(name: str, size_gb: Annotated[float, typer.Option(help="Size in GB (10^9 bytes).")],
                  storage_class: Annotated[str | None, typer.Option("--class")] = None,
                  shared: Annotated[bool, typer.Option(help="Attachable to several allocations.")] = False,
                  output: Output = "table"):
    """Create a volume (creating → available)."""
    body = {"name": name, "size_bytes": int(size_gb * 1e9), "shared": shared,
            **({"storage_class": storage_class} if storage_class else {})}
    v = client().request("POST", "/v1/volumes", body)
    changed(v, f"volume {v['id']} requested ({v.get('state')})", output, f"follow it: tessera volume get {v['id']} -w")


@volume_app.command("list", epilog="Example: tessera volume list -o wide")
def volume_list(output: Output = "table", watch: Watch = False, interval: Interval = 2.0):
    """The tenant's volumes."""
    c = client()
    show_list(lambda: c.items("/v1/volumes", limit=100), VOLUMES, output, watch, interval)


@volume_app.command("get", epilog="Example: tessera volume get 5d0b… -o json")
def volume_get(volume_id: str, output: Output = "table", watch: Watch = False, interval: Interval = 2.0):
    """One volume, with its usage as the storage system counts it."""
    c = client()
    show_read(lambda: c.get(f"/v1/volumes/{volume_id}"), VOLUMES, output, watch, interval)


@volume_app.command("grow", epilog="Example: tessera volume grow 5d0b… --size-gb 100")
def volume_grow(volume_id: str, size_gb: Annotated[float, typer.Option(help="The new, larger size in GB.")],
                output: Output = "table"):
    """Grow a volume (volumes never shrink)."""
    v = client().request("PATCH", f"/v1/volumes/{volume_id}", {"size_bytes": int(size_gb * 1e9)})
    changed(v, f"volume {volume_id} resizing", output, f"follow it: tessera volume get {volume_id} -w")


@volume_app.command("delete", epilog="Example: tessera volume delete 5d0b…")
def volume_delete(volume_id: str, output: Output = "table"):
    """Delete a volume (refused with 409 while attached)."""
    changed(client().request("DELETE", f"/v1/volumes/{volume_id}"), f"volume {volume_id} deleting", output)


@volume_app.command("attach", epilog="Example: tessera volume attach 5d0b… 3f2a… --mode ro")
def volume_attach(volume_id: str, allocation_id: str,
                  mode: Annotated[str, typer.Option(help="rw or ro.")] = "rw", output: Output = "table"):
    """Attach a volume to a running allocation."""
    r = client().request("POST", f"/v1/volumes/{volume_id}/attachments", {"allocation_id": allocation_id, "mode": mode})
    changed(r, f"volume {volume_id} attaching to {allocation_id}", output)


@volume_app.command("detach", epilog="Example: tessera volume detach 5d0b… 3f2a…")
def volume_detach(volume_id: str, allocation_id: str, output: Output = "table"):
    """Detach a volume from an allocation."""
    r = client().request("DELETE", f"/v1/volumes/{volume_id}/attachments/{allocation_id}")
    changed(r, f"volume {volume_id} detaching from {allocation_id}", output)
