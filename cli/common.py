"""What every command shares: the global options' values, the client of the chosen context, the ``-o`` /
``--watch`` options, and showing a list, one document or a change."""
from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Annotated

import typer

from cli.errors import INTERRUPTED, USAGE, CliError
from cli.render import FORMATS, Columns, emit, to_text

GLOBAL: dict = {"context": None}

Output = Annotated[str, typer.Option("--output", "-o", help="table, wide, json, yaml or name.")]
Watch = Annotated[bool, typer.Option("--watch", "-w", help="Keep printing ADDED/MODIFIED/DELETED events.")]
Interval = Annotated[float, typer.Option("--interval", help="Seconds between re-reads while watching.")]
Tenant = Annotated[str | None, typer.Option("--tenant", help="Tenant id (default: the key's own tenant).")]


def client():
    """The API client of ``--context`` (or the environment's, or the current context)."""
    from cli.api import Client
    from cli.config import resolve
    return Client(resolve(GLOBAL["context"]))


def check_output(output: str) -> None:
    if output not in FORMATS:
        raise CliError(f"unknown output format {output!r}: one of {', '.join(FORMATS)}", USAGE)


def show_list(read: Callable[[], list[dict]], columns: Columns, output: str, watch: bool = False,
              interval: float = 2.0) -> None:
    """Print what ``read`` returns; with ``watch``, keep polling and print what changes until Ctrl-C."""
    check_output(output)
    if not watch:
        emit(to_text(read(), columns, output))
        return
    from cli.watch import poll
    with interrupted_quietly():
        poll(read, columns, output, interval)


def show_one(doc: dict, columns: Columns, output: str) -> None:
    check_output(output)
    emit(to_text(doc, columns, output, single=True))


def show_read(read: Callable[[], dict], columns: Columns, output: str, watch: bool = False,
              interval: float = 2.0) -> None:
    """One object ``read`` returns; with ``watch``, the same polled as a list of one until Ctrl-C."""
    if watch:
        show_list(lambda: [read()], columns, output, True, interval)
    else:
        show_one(read(), columns, output)


def changed(doc: object, what: str, output: str = "table", hint: str | None = None) -> None:
    """After a change: the document in json/yaml, else one line naming it (and how to follow it)."""
    if output in ("json", "yaml") and isinstance(doc, dict):
        show_one(doc, Columns(()), output)
        return
    emit(what)
    if hint:
        print(hint, file=sys.stderr)


class interrupted_quietly:
    """Ctrl-C ends a watch without a traceback: exit 130 after an optional line saying how to resume."""

    def __init__(self, hint: str | None = None):
        self.hint = hint

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if kind is KeyboardInterrupt:
            if self.hint:
                print(self.hint, file=sys.stderr)
            raise typer.Exit(INTERRUPTED)
        return False
