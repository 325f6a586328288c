"""login and the named contexts (kubectl-like): which gateway, with which key."""
from __future__ import annotations

from typing import Annotated

import typer

from cli.common import GLOBAL
from cli.errors import NOT_FOUND, USAGE, CliError
from cli.render import Columns, emit, to_text

context_app = typer.Typer(help="Named contexts: a gateway URL and an API key each.", no_args_is_help=True)


def login(url: Annotated[str, typer.Argument(help="The gateway, e.g. http://localhost:8080.")],
          api_key: Annotated[str, typer.Option("--api-key", envvar="TESSERA_API_KEY", prompt=True,
                                               hide_input=True, help="The API key to exchange for tokens.")],
          context: Annotated[str | None, typer.Option("--context", help="Name of the context to write.")] = None):
    """Exchange an API key for tokens and keep it in a named context.

    The context becomes the current one.

    The key stays in the config file (mode 0600) so the token can be re-exchanged before it expires."""
    from cli.api import Client
    from cli.config import Context, load, save
    name = context or GLOBAL["context"] or "default"
    ctx = Context(name, url.rstrip("/"), api_key, saved=False)
    c = Client(ctx)
    c.token()
    claims = c.claims()
    doc = load()
    doc["contexts"][name] = {"url": ctx.url, "api_key": api_key, "token": ctx.token,
                             "token_expires_at": ctx.token_expires_at}
    doc["current"] = name
    path = save(doc)
    emit(f"logged in to {ctx.url} as {claims.get('role')} (context {name}, {path})")


def _names() -> tuple[dict, list[dict]]:
    from cli.config import load
    doc = load()
    rows = [{"name": n, "current": n == doc.get("current"), "url": c.get("url")}
            for n, c in sorted(doc["contexts"].items())]
    return doc, rows


@context_app.command("list", epilog="Example: tessera context list")
def list_(output: Annotated[str, typer.Option("--output", "-o")] = "table"):
    """The contexts of the config file; the current one is marked."""
    _, rows = _names()
    cols = Columns((("current", lambda r: "*" if r["current"] else ""), ("name", "name"), ("url", "url")), key="name")
    emit(to_text(rows, cols, output))


@context_app.command("use", epilog="Example: tessera context use staging")
def use(name: str):
    """Make NAME the current context."""
    from cli.config import save
    doc, _ = _names()
    if name not in doc["contexts"]:
        raise CliError(f"no context named {name!r}", NOT_FOUND)
    doc["current"] = name
    save(doc)
    emit(f"current context: {name}")


@context_app.command("delete", epilog="Example: tessera context delete staging")
def delete(name: str):
    """Forget the context NAME (its key and token)."""
    from cli.config import save
    doc, _ = _names()
    if doc["contexts"].pop(name, None) is None:
        raise CliError(f"no context named {name!r}", NOT_FOUND)
    if doc.get("current") == name:
        doc["current"] = None
    save(doc)
    emit(f"deleted context {name}")


@context_app.command("current", epilog="Example: tessera context current")
def current():
    """The name of the context commands run in (the environment's when TESSERA_URL and TESSERA_API_KEY are set)."""
    from cli.config import resolve
    try:
        emit(resolve(GLOBAL["context"]).name)
    except CliError as exc:
        raise CliError(exc.message, USAGE) from exc
