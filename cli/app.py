"""The `tessera` command: the root app, its global options, and the one place errors become exit codes.

The root group is lazy: it knows each noun's name, module and one-line help (``NOUNS``), and turns only the
noun on the command line into a click command (typer's conversion of every verb costs more than the whole
start-up budget). ``tessera --help`` lists the table without importing any noun."""
from __future__ import annotations

import sys
from typing import Annotated

import typer
from typer.core import TyperGroup

from cli.common import GLOBAL

# name: (module under cli.commands, attribute (a Typer or a function), one-line help)
NOUNS: dict[str, tuple[str, str, str]] = {
    "login": ("session", "login", "Exchange an API key for tokens and keep it in a named context."),
    "context": ("session", "context_app", "Named contexts: a gateway URL and an API key each."),
    "alloc": ("alloc", "app", "Allocations: GPUs on a node (a VM slice or the whole server)."),
    "network": ("network", "network_app", "Tenant networks: isolated L2/L3 with rules."),
    "volume": ("network", "volume_app", "Volumes: quota'd storage mounted into allocations."),
    "cluster": ("paas", "cluster_app", "Clusters: Slurm, Ray or Kubernetes over N of your allocations."),
    "job": ("paas", "job_app", "Jobs: one API to run work on any of your clusters."),
    "image": ("tenant", "image_app", "Guest images."),
    "ssh-key": ("tenant", "sshkey_app", "Stored SSH public keys, given to guests by name."),
    "quota": ("ops", "quota_app", "GPU quotas: show the tenant's (no sub-command), or set one (provider admin)."),
    "usage": ("tenant", "usage", "Metered usage (GPU-seconds, GB-hours) and its rated amount, grouped."),
    "invoice": ("tenant", "invoice_app", "Invoices: this month's draft and finalized ones."),
    "budget": ("tenant", "budget_app", "The tenant's monthly budget and its alert thresholds."),
    "policy": ("tenant", "policy_app", "Guardrail policies (Cedar), evaluated before any command runs."),
    "key": ("tenant", "key_app", "Your API keys."),
    "audit": ("tenant", "audit", "The audit trail: who changed what, and the outcome."),
    "node": ("fleet", "node_app", "Nodes (provider admin): onboarding, cordon, drain, health."),
    "shape": ("fleet", "shape_app", "Shapes: what an allocation asks for."),
    "pool": ("fleet", "pool_app", "Pools (provider admin): placement policy and taints."),
    "spot": ("fleet", "spot_app", "Spot offerings (provider admin): a pool's idle GPUs sold on the spot market."),
    "tenant": ("ops", "tenant_app", "Tenants (provider admin)."),
    "user": ("ops", "user_app", "A tenant's users (provider or tenant admin)."),
    "price-list": ("ops", "price_app", "Price lists: the version in force, publish a new one."),
    "rate-limit": ("ops", "rate_app", "A tenant's API rate limits (provider admin)."),
    "dead-letters": ("ops", "dead_letters", "The newest dead-lettered messages (provider admin)."),
    "events": ("ops", "events", "The live message streams (provider admin), one event a line."),
}


def load_noun(name: str):
    """The click command of noun ``name`` (imports its module and converts only it); None if unknown."""
    if name not in NOUNS:
        return None
    import importlib
    module, attr, _ = NOUNS[name]
    target = getattr(importlib.import_module(f"cli.commands.{module}"), attr)
    if not isinstance(target, typer.Typer):
        single = typer.Typer(rich_markup_mode=None)
        single.command(name, epilog=getattr(target, "epilog", None))(target)
        target = single
    elif target.registered_callback is None and len(target.registered_commands) == 1:
        target.callback()(_group)      # else typer makes a one-verb noun that verb itself (`image list`)
    target.rich_markup_mode = None
    target._add_completion = False     # completion is the root's option only
    command = typer.main.get_command(target)
    command.name = name
    return command


def _group() -> None:
    """A noun with one verb so far."""


class LazyNouns(TyperGroup):
    def list_commands(self, ctx) -> list[str]:
        return list(NOUNS)

    def get_command(self, ctx, cmd_name: str):
        if cmd_name not in self.commands:
            command = load_noun(cmd_name)
            if command is None:
                return None
            self.commands[cmd_name] = command
        return self.commands[cmd_name]

    def format_commands(self, ctx, formatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, help_) for name, (_, _, help_) in NOUNS.items()])


app = typer.Typer(name="tessera", cls=LazyNouns, no_args_is_help=True, rich_markup_mode=None,
                  pretty_exceptions_enable=False, context_settings={"help_option_names": ["-h", "--help"]},
                  help="Tessera's command-line client: GPU allocations, networks, volumes, billing and operations.",
                  epilog="Example: tessera login http://localhost:8080 --api-key $KEY && tessera alloc list")


@app.callback()
def root(context: Annotated[str | None, typer.Option("--context", help="Run in this named context.")] = None):
    """Every command speaks to the gateway of the current context (see `tessera context`)."""
    GLOBAL["context"] = context


def main() -> None:
    """Run the command; CliError → ``error: …`` on stderr and its exit code, never a traceback."""
    from typer._click.exceptions import Abort, ClickException

    from cli.errors import INTERRUPTED, CliError
    command = typer.main.get_command(app)
    try:
        rc = command.main(prog_name="tessera", standalone_mode=False)
    except CliError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        sys.exit(exc.code)
    except ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except (Abort, KeyboardInterrupt):
        sys.exit(INTERRUPTED)
    except BrokenPipeError:
        sys.exit(0)
    sys.exit(rc if isinstance(rc, int) else 0)
