"""``alloc list --watch``: the tenant's event feed (``GET /v1/events``, server-sent; ``id`` a sequence,
``data`` {seq, allocation_id, type, envelope}) wakes a re-read of the allocation it names, resumed with
Last-Event-ID when the stream drops. Where the gateway has no feed (404/405) the list is polled."""
from __future__ import annotations

import json
import sys
import time

from cli.errors import ApiError, CliError
from cli.render import Columns
from cli.watch import Differ, emit_all, poll

RESYNC_S = 30.0    # a full re-list this often, in case an event was missed while reconnecting


def watch_allocations(c, columns: Columns, output: str, interval: float) -> None:
    """Runs until interrupted."""
    def read() -> list[dict]:
        return c.items("/v1/allocations", limit=100)

    differ = Differ(columns.key)
    last_id: str | None = None
    first = True
    while True:
        try:
            # the feed opens first, then the list is read: nothing committed in between is missed
            feed = c.events("/v1/events", last_event_id=last_id, idle_s=5.0)
        except ApiError as exc:
            if exc.status in (404, 405):
                emit_all(differ.diff(read()), columns, output)
                poll(read, columns, output, interval, differ)    # no feed here: poll
                return
            raise
        except CliError:
            time.sleep(min(interval, 2.0))           # the stream could not be (re)opened: try again
            continue
        emit_all(differ.diff(read()), columns, output)
        if first:
            print("watching allocations (Ctrl-C stops)", file=sys.stderr, flush=True)
            first = False
        try:
            last_id = _follow_feed(c, feed, differ, columns, output, last_id, read)
        except CliError:
            time.sleep(min(interval, 2.0))


def _follow_feed(c, feed, differ: Differ, columns: Columns, output: str, last_id: str | None, read) -> str | None:
    """Read the open ``feed`` until it ends; the last event id seen (to resume from)."""
    synced = time.monotonic()
    for ev in feed:
        if ev is None or time.monotonic() - synced > RESYNC_S:
            emit_all(differ.diff(read()), columns, output)
            synced = time.monotonic()
            if ev is None:
                continue
        event_id, _, data = ev
        last_id = event_id or last_id
        try:
            alloc_id = json.loads(data).get("allocation_id")
        except (ValueError, AttributeError):
            continue
        if not alloc_id:
            continue
        try:
            doc = c.get(f"/v1/allocations/{alloc_id}")
        except ApiError as exc:
            if exc.status != 404:
                raise
            doc = None
        emit_all(differ.one(doc, str(alloc_id)), columns, output)
    return last_id
