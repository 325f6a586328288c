"""``--watch`` on reads: typed events (ADDED, MODIFIED, DELETED + the object), one per line (json: one
compact object a line; yaml: one document each; table/name: the type then the row), flushed as written and
never stopping after the first, so a pipe or a file keeps receiving them until the command is stopped."""
from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable

from cli.render import Columns, cell, emit, pick

ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"


class Differ:
    """What changed between one listing and the next, by ``key``."""

    def __init__(self, key: str = "id"):
        self.key = key
        self.known: dict[str, dict] = {}

    def diff(self, docs: Iterable[dict]) -> list[tuple[str, dict]]:
        """The events that turn the last listing into ``docs``; ``docs`` becomes the last listing."""
        current = {str(d.get(self.key)): d for d in docs}
        events = [(ADDED if k not in self.known else MODIFIED, d) for k, d in current.items()
                  if self.known.get(k) != d]
        events += [(DELETED, d) for k, d in self.known.items() if k not in current]
        self.known = current
        return events

    def one(self, doc: dict | None, key: str) -> list[tuple[str, dict]]:
        """The event for one re-read document (None: it is gone)."""
        before = self.known.get(key)
        if doc is None:
            return [(DELETED, self.known.pop(key))] if before is not None else []
        self.known[key] = doc
        if before == doc:
            return []
        return [(ADDED if before is None else MODIFIED, doc)]


def line(kind: str, doc: dict, columns: Columns, output: str) -> str:
    """One event as text in ``output``'s format."""
    if output == "json":
        return json.dumps({"type": kind, "object": doc}, separators=(",", ":"), default=str)
    if output == "yaml":
        import yaml
        return "---\n" + yaml.safe_dump({"type": kind, "object": doc}, sort_keys=False).rstrip()
    if output == "name":
        return f"{kind} {doc.get(columns.key)}"
    return "\t".join([kind, *(cell(pick(doc, g)) for _, g in columns.of(output))])


def emit_all(events: list[tuple[str, dict]], columns: Columns, output: str) -> None:
    for kind, doc in events:
        emit(line(kind, doc, columns, output))


def poll(read: Callable[[], list[dict]], columns: Columns, output: str, interval: float,
         differ: Differ | None = None) -> None:
    """Re-read the list every ``interval`` seconds and print what changed (since ``differ``'s last listing,
    when given); runs until interrupted."""
    differ = differ or Differ(columns.key)
    while True:
        emit_all(differ.diff(read()), columns, output)
        time.sleep(interval)
