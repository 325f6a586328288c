"""The tenant's other nouns: images, SSH keys, quota, usage, invoices, budget, policies, API keys, audit."""
from __future__ import annotations

from typing import Annotated

import typer

from cli.common import Interval, Output, Tenant, Watch, changed, client, show_list, show_one
from cli.render import Columns, emit

image_app = typer.Typer(help="Guest images.", no_args_is_help=True)
sshkey_app = typer.Typer(help="Stored SSH public keys, given to guests by name.", no_args_is_help=True)
invoice_app = typer.Typer(help="Invoices: this month's draft and finalized ones.", no_args_is_help=True)
budget_app = typer.Typer(help="The tenant's monthly budget and its alert thresholds.", no_args_is_help=True)
policy_app = typer.Typer(help="Guardrail policies (Cedar), evaluated before any command runs.", no_args_is_help=True)
key_app = typer.Typer(help="Your API keys.", no_args_is_help=True)

IMAGES = Columns((("id", "id"), ("name", "name"), ("os", "os"), ("format", "format"), ("default", "default")),
                 (("visibility", "visibility"), ("min_disk_gb", "min_disk_gb"), ("sha256", "sha256")))
SSH_KEYS = Columns((("name", "name"), ("type", "type"), ("fingerprint", "fingerprint")),
                   (("comment", "comment"), ("created", "created_at")), key="name")
USAGE = Columns((("key", "key"), ("gpu_seconds", "gpu_seconds"), ("gb_hours", "gb_hours"),
                 ("amount_minor", "amount_minor"), ("currency", "currency")), (("records", "records"),), key="key")
INVOICES = Columns((("id", "invoice_id"), ("number", "number"), ("period", "period"), ("status", "status"),
                    ("total", lambda i: [f"{t['amount_minor']} {t['currency']}" for t in i.get("totals") or []])),
                   (("finalized", "finalized_at"), ("hash", "content_hash")), key="invoice_id")
BUDGET = Columns((("tenant", "tenant_id"), ("amount_minor", "budget.amount_minor"), ("currency", "budget.currency"),
                  ("spend_minor", "budget.spend_minor"), ("forecast_minor", "budget.forecast_minor")),
                 key="tenant_id")
POLICIES = Columns((("id", "id"), ("scope", "scope"), ("name", "name"), ("enabled", "enabled"),
                    ("version", "version")), (("builtin", "builtin"), ("description", "description")))
KEYS = Columns((("id", "id"), ("name", "name"), ("state", "state"), ("expires", "expires_at")),
               (("created", "created_at"), ("last_used", "last_used_at"), ("revoked", "revoked_at")))
AUDIT = Columns((("seq", "seq"), ("time", "event_time"), ("action", "action"), ("target", "target_id"),
                 ("outcome", "outcome"), ("status", "status")),
                (("user", "user_id"), ("role", "role"), ("path", "path")), key="seq")


@image_app.command("list", epilog="Example: tessera image list")
def image_list(output: Output = "table", watch: Watch = False, interval: Interval = 2.0):
    """Images a guest can boot (the default one is marked)."""
    c = client()
    show_list(lambda: c.items("/v1/images", limit=100), IMAGES, output, watch, interval)


@sshkey_app.command("add", epilog="Example: tessera ssh-key add laptop ~/.ssh/id_ed25519.pub")
def sshkey_add(name: str, public_key_file: Annotated[typer.FileText, typer.Argument(help="The .pub file (- for stdin).")],
               output: Output = "table"):
    """Store a public key under NAME (give it to allocations with --ssh-key NAME)."""
    k = client().request("POST", "/v1/ssh-keys", {"name": name, "public_key": public_key_file.read().strip()})
    changed(k, f"ssh key {name} added ({k.get('fingerprint')})", output)


@sshkey_app.command("list", epilog="Example: tessera ssh-key list")
def sshkey_list(output: Output = "table", watch: Watch = False, interval: Interval = 2.0):
    """Your stored SSH keys."""
    c = client()
    show_list(lambda: c.items("/v1/ssh-keys"), SSH_KEYS, output, watch, interval)


@sshkey_app.command("get", epilog="Example: tessera ssh-key get laptop -o json")
def sshkey_get(name: str, output: Output = "table"):
    """One stored key."""
    show_one(client().get(f"/v1/ssh-keys/{name}"), SSH_KEYS, output)


@sshkey_app.command("delete", epilog="Example: tessera ssh-key delete laptop")
def sshkey_delete(name: str):
    """Forget a stored key (guests that have it keep it)."""
    client().request("DELETE", f"/v1/ssh-keys/{name}")
    emit(f"ssh key {name} deleted")


def usage(output: Output = "table",
          group_by: Annotated[str, typer.Option(help="shape, gpu_model, pool, storage_class, user, spot, day, hour.")]
          = "shape",
          since: Annotated[str | None, typer.Option("--from", help="ISO date-time.")] = None,
          until: Annotated[str | None, typer.Option("--to", help="ISO date-time.")] = None,
          tenant: Tenant = None):
    """Metered usage (GPU-seconds, GB-hours) and its rated amount, grouped."""
    c = client()
    q = {"group_by": group_by, "from": since, "to": until, "tenant_id": tenant}
    show_list(lambda: c.request("GET", "/v1/usage", query=q).get("groups") or [], USAGE, output)


@invoice_app.command("list", epilog="Example: tessera invoice list --status draft")
def invoice_list(output: Output = "table", status: Annotated[str | None, typer.Option()] = None,
                 period: Annotated[str | None, typer.Option(help="YYYY-MM.")] = None, tenant: Tenant = None,
                 watch: Watch = False, interval: Interval = 2.0):
    """Invoices (tenant admin)."""
    c = client()
    show_list(lambda: c.items("/v1/invoices", status=status, period=period, tenant_id=tenant),
              INVOICES, output, watch, interval)


@invoice_app.command("get", epilog="Example: tessera invoice get 2b9f… -o yaml")
def invoice_get(invoice_id: str, output: Output = "table"):
    """One invoice with its lines (-o yaml shows them)."""
    show_one(client().get(f"/v1/invoices/{invoice_id}"), INVOICES, output)


@invoice_app.command("open", epilog="Example: tessera invoice open 2b9f…")
def invoice_open(invoice_id: str):
    """Write the invoice's HTML to a temporary file; open it in the browser when there is a display, else
    print the path."""
    import os
    import tempfile
    html = client().text(f"/v1/invoices/{invoice_id}/html")
    fd, path = tempfile.mkstemp(prefix=f"invoice-{invoice_id[:8]}-", suffix=".html")
    with os.fdopen(fd, "w") as f:
        f.write(html)
    if os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"):
        import webbrowser
        if webbrowser.open(f"file://{path}"):
            emit(f"opened {path}")
            return
    emit(path)


@budget_app.command("get", epilog="Example: tessera budget get -o yaml")
def budget_get(output: Output = "table", tenant: Tenant = None):
    """The budget, its thresholds crossed and the spend cap."""
    c = client()
    show_one(c.get(f"/v1/tenants/{c.tenant_id(tenant)}/budget"), BUDGET, output)


@budget_app.command("set", epilog="Example: tessera budget set --amount-minor 100000 --currency USD --threshold 80")
def budget_set(amount_minor: Annotated[int, typer.Option(help="In the currency's minor unit (cents).")],
               currency: Annotated[str, typer.Option()] = "USD",
               threshold: Annotated[list[int], typer.Option(help="Percent that alerts (repeatable).")] = [80, 100],  # noqa: B006
               webhook_url: Annotated[str | None, typer.Option()] = None, tenant: Tenant = None,
               output: Output = "table"):
    """Set the monthly budget."""
    c = client()
    body = {"amount_minor": amount_minor, "currency": currency, "thresholds": [{"percent": p} for p in threshold],
            **({"webhook_url": webhook_url} if webhook_url else {})}
    tid = c.tenant_id(tenant)
    changed(c.request("PUT", f"/v1/tenants/{tid}/budget", body), f"budget of tenant {tid} set", output)


@budget_app.command("delete", epilog="Example: tessera budget delete")
def budget_delete(tenant: Tenant = None):
    """Remove the budget."""
    c = client()
    tid = c.tenant_id(tenant)
    c.request("DELETE", f"/v1/tenants/{tid}/budget")
    emit(f"budget of tenant {tid} deleted")


@policy_app.command("list", epilog="Example: tessera policy list -o wide")
def policy_list(output: Output = "table", tenant: Tenant = None, watch: Watch = False, interval: Interval = 2.0):
    """The policies in force for the tenant (provider's and its own)."""
    c = client()
    show_list(lambda: c.items("/v1/policies", tenant_id=tenant), POLICIES, output, watch, interval)


@policy_app.command("get", epilog="Example: tessera policy get 61d2… -o yaml")
def policy_get(policy_id: str, output: Output = "table"):
    """One policy with its Cedar text (-o yaml)."""
    show_one(client().get(f"/v1/policies/{policy_id}"), POLICIES, output)


@policy_app.command("create", epilog="Example: tessera policy create no-spot policy.cedar --scope tenant")
def policy_create(name: str, cedar_file: Annotated[typer.FileText, typer.Argument(help="The Cedar text (- for stdin).")],
                  scope: Annotated[str, typer.Option(help="tenant or provider.")] = "tenant",
                  description: Annotated[str, typer.Option()] = "", tenant: Tenant = None, output: Output = "table"):
    """Add a policy."""
    body = {"scope": scope, "name": name, "description": description, "text": cedar_file.read(),
            **({"tenant_id": tenant} if tenant else {})}
    p = client().request("POST", "/v1/policies", body)
    changed(p, f"policy {p['id']} created", output)


@policy_app.command("delete", epilog="Example: tessera policy delete 61d2…")
def policy_delete(policy_id: str):
    """Remove a policy."""
    client().request("DELETE", f"/v1/policies/{policy_id}")
    emit(f"policy {policy_id} deleted")


@policy_app.command("evaluate", epilog="Example: tessera policy evaluate createAllocation --resource shape=vm.8gpu "
                    "--resource gpu_count=8 --resource pool=shared --resource spot=false ...")
def policy_evaluate(operation: Annotated[str, typer.Argument(help="An operationId: createAllocation, createVolume, ...")],
                    resource: Annotated[list[str], typer.Option(help="KEY=VALUE of the resource (repeatable).")] = [],  # noqa: B006
                    role: Annotated[str | None, typer.Option()] = None, output: Output = "table"):
    """Would OPERATION be allowed? Exit 4 when denied."""
    import json

    from cli.errors import DENIED
    res = {}
    for kv in resource:
        k, _, v = kv.partition("=")
        try:
            res[k] = json.loads(v)
        except ValueError:
            res[k] = v
    d = client().request("POST", "/v1/policies/evaluate",
                         {"operation": operation, "resource": res, **({"role": role} if role else {})})
    changed(d, f"{'allowed' if d.get('allowed') else 'denied'}: {d.get('reason') or ''}".rstrip(": "), output)
    if not d.get("allowed"):
        raise typer.Exit(DENIED)


def _me(c, user: str | None, tenant: str | None) -> tuple[str, str]:
    """The (tenant, user) whose keys a verb reads: the key's own unless named (a provider admin belongs to no
    tenant and names both)."""
    return c.tenant_id(tenant), user or c.claims()["sub"]


@key_app.command("list", epilog="Example: tessera key list")
def key_list(output: Output = "table", user: Annotated[str | None, typer.Option()] = None, tenant: Tenant = None,
             watch: Watch = False, interval: Interval = 2.0):
    """Your API keys (or a user's, as tenant admin; a provider admin names --tenant and --user)."""
    c = client()
    tid, uid = _me(c, user, tenant)
    show_list(lambda: c.items(f"/v1/tenants/{tid}/users/{uid}/api-keys"), KEYS, output, watch, interval)


@key_app.command("create", epilog="Example: tessera key create ci --expires-in 86400")
def key_create(name: str, expires_in: Annotated[int | None, typer.Option(help="Seconds.")] = None,
               user: Annotated[str | None, typer.Option()] = None, tenant: Tenant = None, output: Output = "table"):
    """A new API key; its secret is shown once."""
    c = client()
    tid, uid = _me(c, user, tenant)
    k = c.request("POST", f"/v1/tenants/{tid}/users/{uid}/api-keys", {"name": name, "expires_in_s": expires_in})
    changed(k, f"api key {k['id']} created: {k['api_key']}", output)


@key_app.command("revoke", epilog="Example: tessera key revoke 0c4e…")
def key_revoke(key_id: str, user: Annotated[str | None, typer.Option()] = None, tenant: Tenant = None):
    """Revoke an API key at once."""
    c = client()
    tid, uid = _me(c, user, tenant)
    c.request("DELETE", f"/v1/tenants/{tid}/users/{uid}/api-keys/{key_id}")
    emit(f"api key {key_id} revoked")


def audit(output: Output = "table", action: Annotated[str | None, typer.Option()] = None,
          target: Annotated[str | None, typer.Option(help="Target id.")] = None,
          since: Annotated[str | None, typer.Option("--from")] = None,
          limit: Annotated[int, typer.Option()] = 50):
    """The audit trail: who changed what, and the outcome."""
    c = client()
    q = {"action": action, "target_id": target, "from": since, "limit": limit}
    show_list(lambda: c.request("GET", "/v1/audit", query=q).get("items") or [], AUDIT, output)


usage.epilog = "Example: tessera usage --group-by day"
audit.epilog = "Example: tessera audit --action allocation.create"
APPS = (("image", image_app), ("ssh-key", sshkey_app), ("invoice", invoice_app), ("budget", budget_app),
        ("policy", policy_app), ("key", key_app))
COMMANDS = (("usage", usage), ("audit", audit))
