"""The watch differ: ADDED, MODIFIED, DELETED by id, and the event lines."""
from __future__ import annotations

import json

from cli.render import Columns
from cli.watch import ADDED, DELETED, MODIFIED, Differ, line


def test_first_listing_is_all_added_then_only_changes():
    d = Differ()
    a, b = {"id": "a", "state": "REQUESTED"}, {"id": "b", "state": "QUEUED"}
    assert d.diff([a, b]) == [(ADDED, a), (ADDED, b)]
    assert d.diff([a, b]) == []
    a2, c = {**a, "state": "ACTIVE"}, {"id": "c", "state": "REQUESTED"}
    assert d.diff([a2, c]) == [(MODIFIED, a2), (ADDED, c), (DELETED, b)]


def test_one_rereads_document():
    d = Differ()
    a = {"id": "a", "state": "REQUESTED"}
    assert d.one(a, "a") == [(ADDED, a)]
    assert d.one(a, "a") == []
    a2 = {**a, "state": "ACTIVE"}
    assert d.one(a2, "a") == [(MODIFIED, a2)]
    assert d.one(None, "a") == [(DELETED, a2)]
    assert d.one(None, "a") == []


def test_differ_keys_by_the_named_field():
    d = Differ("name")
    assert d.diff([{"name": "x", "v": 1}]) == [(ADDED, {"name": "x", "v": 1})]
    assert d.diff([{"name": "x", "v": 2}]) == [(MODIFIED, {"name": "x", "v": 2})]


def test_event_lines_in_each_format():
    cols = Columns((("id", "id"), ("state", "state")))
    doc = {"id": "a", "state": "ACTIVE"}
    assert json.loads(line(ADDED, doc, cols, "json")) == {"type": "ADDED", "object": doc}
    assert "\n" not in line(ADDED, doc, cols, "json")
    assert line(MODIFIED, doc, cols, "name") == "MODIFIED a"
    assert line(DELETED, doc, cols, "table").split() == ["DELETED", "a", "ACTIVE"]
    assert line(ADDED, doc, cols, "yaml").startswith("---\n")


def test_server_sent_events_are_parsed_and_a_quiet_stream_yields_none():
    import queue

    from cli.api import _parse_sse
    q: queue.Queue = queue.Queue()
    for raw in (b": keep-alive\n", b"id: 7\n", b"event: allocation.activated\n", b'data: {"a":\n', b"data: 1}\n",
                b"\n"):
        q.put(raw)
    events = _parse_sse(q, idle_s=0.01)
    assert next(events) == ("7", "allocation.activated", '{"a":\n1}')
    assert next(events) is None                      # nothing for idle_s: the caller may look around
    q.put(b"")
    assert list(events) == []                        # the server ended the stream


def test_ops_events_are_filtered_on_the_envelope():
    from cli.ops_events import matches
    item = {"type": "allocation.evt.activated",
            "envelope": {"tenant_id": "t1", "correlation_id": "a1", "data": {"allocation_id": "a1"}}}
    assert matches(item, "t1", ["allocation.*"], "a1")
    assert not matches(item, "t2", [], None)
    assert not matches(item, None, ["saga.*"], None)
    assert not matches(item, None, [], "a2")
    assert matches({**item, "envelope": {**item["envelope"], "correlation_id": "x"}}, None, [], "a1")
