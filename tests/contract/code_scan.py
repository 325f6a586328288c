"""Find the message types that service code names as string literals, with `ast` (nothing is imported).

Call sites recognised (the ways the shared kit takes a message type):
- ``<x>.subscribe("t", ...)`` / ``subscribe(type_="t")``          -> the service handles t
- ``<x>.emit("t", ...)``                                          -> the service emits t
- ``<x>.add(conn, "t", model, ...)`` (Outbox.add: 3+ positionals)  -> the service emits t
- ``invoke(..., succeeded="t1", failed="t2")``                     -> the service emits t1, t2
- ``undo(..., undone="t")``                                       -> the service emits t
A type built at run time (a variable, an f-string) is not seen here; the catalog refuses it at run time.
"""
from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Role = Literal["handles", "emits"]


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


def _typed_args(call: ast.Call) -> Iterator[tuple[Role, ast.expr | None]]:
    name = _name(call.func)
    kw = {k.arg: k.value for k in call.keywords if k.arg}
    is_method = isinstance(call.func, ast.Attribute)
    if name == "subscribe" and is_method:
        yield "handles", call.args[0] if call.args else kw.get("type_")
    elif name == "emit" and is_method:
        yield "emits", call.args[0] if call.args else kw.get("type_")
    elif name == "add" and is_method:
        if len(call.args) >= 3 or "type_" in kw:
            yield "emits", call.args[1] if len(call.args) >= 3 else kw.get("type_")
    elif name == "invoke":
        yield "emits", kw.get("succeeded")
        yield "emits", kw.get("failed")
    elif name == "undo":
        yield "emits", kw.get("undone")


def scan_source(source: str, *, service: str, path: str) -> list[Use]:
    uses = []
    for node in ast.walk(ast.parse(source, filename=path)):
        if isinstance(node, ast.Call):
            for role, arg in _typed_args(node):
                if (value := _str(arg)) is not None:
                    uses.append(Use(service, path, node.lineno, role, value))
    return uses


def scan_services(root: Path) -> list[Use]:
    """Every use under ``root/services/<service>/**.py``."""
    uses = []
    for path in sorted((root / "services").glob("*/**/*.py")):
        rel = path.relative_to(root)
        uses += scan_source(path.read_text(), service=rel.parts[1], path=str(rel))
    return uses
