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
