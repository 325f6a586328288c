"""Output of reads: ``-o table|wide|json|yaml|name``. A noun describes its columns once (``Columns``); json
and yaml show the documents as the API gave them; name prints one id a line (for xargs and $(...)).
yaml is imported only when yaml is printed; rich never is here (tables are plain text)."""
from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

FORMATS = ("table", "wide", "json", "yaml", "name")

Getter = str | Callable[[dict], object]


@dataclass(frozen=True)
class Columns:
    """``table``: (header, key path or function) pairs; ``wide`` adds its own after them; ``key`` names the
    field that identifies a document (for ``-o name`` and the watch's differ)."""
    table: Sequence[tuple[str, Getter]]
    wide: Sequence[tuple[str, Getter]] = field(default_factory=tuple)
    key: str = "id"

    def of(self, output: str) -> list[tuple[str, Getter]]:
        return [*self.table, *(self.wide if output == "wide" else ())]


def pick(doc: dict, getter: Getter) -> object:
    if callable(getter):
        return getter(doc)
    value: object = doc
    for part in getter.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def cell(value: object) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items()) or "-"
    if isinstance(value, list | tuple):
        return ",".join(cell(v) for v in value) or "-"
    return str(value)


def rows(docs: Sequence[dict], columns: Columns, output: str) -> list[list[str]]:
    return [[cell(pick(d, g)) for _, g in columns.of(output)] for d in docs]


def to_text(docs: Sequence[dict] | dict, columns: Columns, output: str, single: bool = False) -> str:
    """The text for ``docs`` (a list, or one document when ``single``) in ``output`` format."""
    items = [docs] if single else list(docs)
    if output == "json":
        return json.dumps(docs if single else {"items": items}, indent=2, default=str)
    if output == "yaml":
        import yaml
        return yaml.safe_dump(docs if single else {"items": items}, sort_keys=False, default_flow_style=False).rstrip()
    if output == "name":
        return "\n".join(str(d.get(columns.key)) for d in items)
    return table([h for h, _ in columns.of(output)], rows(items, columns, output))


def table(headers: list[str], body: list[list[str]]) -> str:
    """A plain table, columns padded to their widest cell, no colour and no wrapping, so pipes and grep see
    columns (drawn here rather than with rich: importing rich costs a read most of its time budget)."""
    if not body:
        return "No resources found."
    head = [h.upper() for h in headers]
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [head, *body])


def emit(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
