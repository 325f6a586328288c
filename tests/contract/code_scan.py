"""Find the message types that service code names, with `ast` (service code is not imported).

Call sites recognised (the ways the shared kit takes a message type), as string literals:
- ``<x>.subscribe("t", ...)`` / ``subscribe(type_="t")``          -> the service handles t
- ``<x>.emit("t", ...)``                                          -> the service emits t
- ``<x>.add(conn, "t", model, ...)`` (Outbox.add: 3+ positionals)  -> the service emits t
or through a declared saga step (shared.steps.Step), named by its constant (``STEP`` or ``c.STEP``):
- ``<x>.participate(STEP, ...)``                  -> the service handles STEP's command (and its undo)
- ``invoke(..., step=STEP)``, ``answer(ctx, STEP, ...)`` -> the service emits STEP's ok, failed and progress
- ``finish(ctx, STEP, ...)`` -> ok and failed; ``defer(ctx, STEP, ...)`` -> progress; ``undo(..., step=STEP)`` -> undone
The steps are read from the services' contracts modules (declarations only: importing them does no I/O).
A type built at run time (a variable, an f-string) is not seen here; the catalog refuses it at run time.
"""
from __future__ import annotations

import ast
import functools
import importlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from shared.contract import SERVICES
from shared.steps import Step

Role = Literal["handles", "emits"]
# the replies a kit function sends, by the function's name, when it is given a declared step
STEP_REPLIES = {"invoke": ("ok", "failed", "progress"), "answer": ("ok", "failed", "progress"),
                "finish": ("ok", "failed"), "defer": ("progress",), "undo": ("undone",)}


@dataclass(frozen=True)
class Use:
    service: str
    path: str
    line: int
    role: Role
    type: str

    def where(self) -> str:
        return f"{self.path}:{self.line}"


def _name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def _str(node: ast.expr | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


@functools.cache
def declared_steps() -> dict[str, Step]:
    """Every declared saga step, by the name of its constant in its service's contracts module."""
    steps: dict[str, Step] = {}
    for service in SERVICES:
        for name, value in vars(importlib.import_module(f"services.{service}.contracts")).items():
            if isinstance(value, Step):
                assert steps.setdefault(name, value) is value, f"two steps are declared as {name}"
    return steps


def _step(call: ast.Call, steps: Mapping[str, Step]) -> Step | None:
    """The declared step a call is given (positionally or by keyword), if any."""
    for arg in [*call.args, *(k.value for k in call.keywords)]:
        if (name := _name(arg)) in steps:
            return steps[name]
    return None


def _typed_args(call: ast.Call, steps: Mapping[str, Step]) -> Iterator[tuple[Role, str | None]]:
    name = _name(call.func)
    kw = {k.arg: k.value for k in call.keywords if k.arg}
    is_method = isinstance(call.func, ast.Attribute)
    if name == "subscribe" and is_method:
        yield "handles", _str(call.args[0] if call.args else kw.get("type_"))
    elif name == "emit" and is_method:
        yield "emits", _str(call.args[0] if call.args else kw.get("type_"))
    elif name == "add" and is_method:
        if len(call.args) >= 3 or "type_" in kw:
            yield "emits", _str(call.args[1] if len(call.args) >= 3 else kw.get("type_"))
    step = _step(call, steps) if name in STEP_REPLIES or name == "participate" else None
    if step is None:
        return
    if name == "participate" and is_method:
        yield from (("handles", m.type) for m in step.commands)
    elif name in STEP_REPLIES:
        replies = [getattr(step, attr) for attr in STEP_REPLIES[name]]
        yield from (("emits", m.type) for m in replies if m is not None)


def scan_source(source: str, *, service: str, path: str, steps: Mapping[str, Step] | None = None) -> list[Use]:
    steps = declared_steps() if steps is None else steps
    uses = []
    for node in ast.walk(ast.parse(source, filename=path)):
        if isinstance(node, ast.Call):
            for role, value in _typed_args(node, steps):
                if value is not None:
                    uses.append(Use(service, path, node.lineno, role, value))
    return uses


def scan_services(root: Path) -> list[Use]:
    """Every use under ``root/services/<service>/**.py``."""
    uses = []
    for path in sorted((root / "services").glob("*/**/*.py")):
        rel = path.relative_to(root)
        uses += scan_source(path.read_text(), service=rel.parts[1], path=str(rel))
    return uses
