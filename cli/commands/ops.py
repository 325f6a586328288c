"""Operator verbs for tenants and the platform: tenants, users, quotas, price lists, rate limits, dead
letters and the live event stream (plus the tenant's own `tessera quota`)."""
from __future__ import annotations

from typing import Annotated

import typer

from cli.common import Interval, Output, Tenant, Watch, changed, client, show_list, show_one
from cli.errors import USAGE, CliError
from cli.render import Columns

tenant_app = typer.Typer(help="Tenants (provider admin).", no_args_is_help=True)
user_app = typer.Typer(help="A tenant's users (provider or tenant admin).", no_args_is_help=True)
quota_app = typer.Typer(help="GPU quotas: show the tenant's (no sub-command), or set one (provider admin).",
                        invoke_without_command=True)
price_app = typer.Typer(help="Price lists: the version in force, publish a new one.", no_args_is_help=True)
rate_app = typer.Typer(help="A tenant's API rate limits (provider admin).", no_args_is_help=True)

TENANTS = Columns((("id", "id"), ("name", "name"), ("weight", "weight"), ("created", "created_at")))
USERS = Columns((("id", "id"), ("name", "name"), ("role", "role")), (("tenant", "tenant_id"), ("created", "created_at")))
QUOTAS = Columns((("pool", "pool"), ("gpu_model", "gpu_model"), ("limit", "limit"), ("guaranteed", "guaranteed"),
                  ("used", "used")), (("version", "version"),), key="pool")
PRICES = Columns((("version", "version"), ("currency", "currency"), ("effective_from", "effective_from"),
                  ("in_force", "in_force")), (("published_by", "published_by"), ("published_at", "published_at")),
                 key="version")


def _rates(doc: dict) -> str:
    """``read=500/1000,write=…``: each limit as per second / burst (a nested dict printed as is is unreadable)."""
    parts = []
    for name, v in (doc.get("effective") or {}).items():
        parts.append(f"{name}={v.get('per_s')}/{v.get('burst')}" if isinstance(v, dict) else f"{name}={v}")
    return ",".join(parts)


RATES = Columns((("tenant", "tenant_id"), ("overridden", "overridden"), ("effective", _rates)),
                (("set_by", "set_by"), ("set_at", "set_at")), key="tenant_id")
DEAD = Columns((("seq", "seq"), ("subject", "subject"), ("time", "time")), key="seq")


@tenant_app.command("list", epilog="Example: tessera tenant list")
def tenant_list(output: Output = "table", watch: Watch = False, interval: Interval = 2.0):
    """Every tenant."""
    c = client()
    show_list(lambda: c.items("/v1/tenants"), TENANTS, output, watch, interval)


Weight = Annotated[int | None, typer.Option(min=1, max=100, help="Its share of each service's work while its "
                                                                 "messages wait with other tenants' (1-100).")]


@tenant_app.command("create", epilog="Example: tessera tenant create acme --weight 2")
def tenant_create(name: str, weight: Weight = None, output: Output = "table"):
    """Create a tenant."""
    t = client().request("POST", "/v1/tenants", {"name": name} | ({"weight": weight} if weight else {}))
    changed(t, f"tenant {t['id']} created", output)


@tenant_app.command("set-weight", epilog="Example: tessera tenant set-weight 1b7c… 3")
def tenant_set_weight(tenant: str, weight: Annotated[int, typer.Argument(min=1, max=100)], output: Output = "table"):
    """Change a tenant's weight: its messages are served `weight` to one against a tenant of weight 1."""
    t = client().request("PATCH", f"/v1/tenants/{tenant}", {"weight": weight})
    changed(t, f"tenant {t['id']} weight {t['weight']}", output)


@user_app.command("create", epilog="Example: tessera user create alice --tenant 1b7c… --role tenant_admin")
def user_create(name: str, tenant: Annotated[str, typer.Option(help="The tenant's id.")],
                role: Annotated[str, typer.Option(help="tenant_admin or tenant_user.")] = "tenant_user",
                output: Output = "table"):
    """Create a user; its first API key is shown once."""
    u = client().request("POST", f"/v1/tenants/{tenant}/users", {"name": name, "role": role})
    changed(u, f"user {u['id']} created; api key: {u.get('api_key')}", output)


@user_app.command("list", epilog="Example: tessera user list --tenant 1b7c…")
def user_list(tenant: Tenant = None, output: Output = "table", watch: Watch = False, interval: Interval = 2.0):
    """A tenant's users."""
    c = client()
    tid = c.tenant_id(tenant)
    show_list(lambda: c.items(f"/v1/tenants/{tid}/users"), USERS, output, watch, interval)


@quota_app.callback(epilog="Example: tessera quota; tessera quota set --tenant 1b7c… shared H100 16")
def quota(ctx: typer.Context, output: Output = "table", tenant: Tenant = None, watch: Watch = False,
          interval: Interval = 2.0):
    """The tenant's GPU quotas per pool and model, and what is used."""
    if ctx.invoked_subcommand is not None:
        return
    c = client()
    tid = c.tenant_id(tenant)
    show_list(lambda: c.items(f"/v1/tenants/{tid}/quotas"), QUOTAS, output, watch, interval)


@quota_app.command("set", epilog="Example: tessera quota set shared H100 16 --tenant 1b7c… --guaranteed 8")
def quota_set(pool: str, gpu_model: str, limit: int, tenant: Annotated[str, typer.Option()],
              guaranteed: Annotated[int, typer.Option()] = 0, output: Output = "table"):
    """Set a tenant's quota of GPU_MODEL in POOL (provider admin)."""
    r = client().request("PUT", f"/v1/tenants/{tenant}/quotas/{pool}/{gpu_model}",
                         {"limit": limit, "guaranteed": guaranteed})
    changed(r, f"quota {pool}/{gpu_model} of tenant {tenant} set to {limit}", output)


@price_app.command("list", epilog="Example: tessera price-list list -o yaml")
def price_list(output: Output = "table", watch: Watch = False, interval: Interval = 2.0):
    """Published price lists (the one in force is marked)."""
    c = client()
    show_list(lambda: c.items("/v1/price-lists"), PRICES, output, watch, interval)


@price_app.command("publish", epilog="Example: tessera price-list publish 2027-01 prices.json")
def price_publish(version: str, body_file: Annotated[typer.FileText, typer.Argument(help="JSON body (- for stdin).")],
                  output: Output = "table"):
    """Publish a price list from a JSON file (currency, effective_from, gpu_prices, ...)."""
    import json
    r = client().request("PUT", f"/v1/price-lists/{version}", json.load(body_file))
    changed(r, f"price list {version} published", output)


@rate_app.command("get", epilog="Example: tessera rate-limit get --tenant 1b7c…")
def rate_get(tenant: Tenant = None, output: Output = "table"):
    """A tenant's effective rate limits and whether they are overridden."""
    c = client()
    show_one(c.get(f"/v1/tenants/{c.tenant_id(tenant)}/rate-limits"), RATES, output)


@rate_app.command("set", epilog="Example: tessera rate-limit set --tenant 1b7c… --limit write_per_s=2")
def rate_set(tenant: Annotated[str, typer.Option()],
             limit: Annotated[list[str], typer.Option(help="NAME=VALUE, e.g. write_per_s=2 (repeatable).")],
             output: Output = "table"):
    """Override some of a tenant's rate limits."""
    body = {}
    for kv in limit:
        k, sep, v = kv.partition("=")
        if not sep or not v.strip().isdigit():
            raise CliError(f"--limit wants NAME=NUMBER, not {kv!r}", USAGE)
        body[k] = int(v)
    changed(client().request("PUT", f"/v1/tenants/{tenant}/rate-limits", body), f"rate limits of {tenant} set", output)


@rate_app.command("delete", epilog="Example: tessera rate-limit delete --tenant 1b7c…")
def rate_delete(tenant: Annotated[str, typer.Option()]):
    """Back to the defaults."""
    client().request("DELETE", f"/v1/tenants/{tenant}/rate-limits")
    print(f"rate limits of {tenant} deleted")


def dead_letters(output: Output = "table", limit: Annotated[int, typer.Option()] = 20):
    """The newest dead-lettered messages (provider admin)."""
    c = client()
    show_list(lambda: c.items("/v1/ops/dead-letters", limit=limit), DEAD, output)


def events(follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep streaming (the default).")] = True,
           tenant: Annotated[str | None, typer.Option(help="Only this tenant's messages.")] = None,
           type_: Annotated[list[str], typer.Option("--type", help="Message type, * as a wildcard.")] = [],  # noqa: B006
           allocation: Annotated[str | None, typer.Option(help="Only this allocation's messages.")] = None,
           subjects: Annotated[str | None, typer.Option(help="NATS subject filters, comma-separated.")] = None,
           output: Output = "table"):
    """The live message streams (provider admin), one event a line."""
    from cli.common import interrupted_quietly
    from cli.ops_events import stream
    with interrupted_quietly():
        stream(client(), follow, tenant, type_, allocation, subjects, output)


dead_letters.epilog = "Example: tessera dead-letters -o json"
events.epilog = "Example: tessera events --follow --type 'saga.*' --allocation 3f2a…"
APPS = (("tenant", tenant_app), ("user", user_app), ("quota", quota_app), ("price-list", price_app),
        ("rate-limit", rate_app))
COMMANDS = (("dead-letters", dead_letters), ("events", events))
