"""The CLI's output formats: table, wide, json, yaml, name, and the lazy root's noun table."""
from __future__ import annotations

import json

import yaml

from cli.render import Columns, cell, to_text

COLS = Columns((("id", "id"), ("state", "state"), ("node", "instance.node_id")), (("labels", "labels"),))
DOCS = [{"id": "a1", "state": "ACTIVE", "instance": {"node_id": "n1"}, "labels": {"team": "ml"}},
        {"id": "b2", "state": "QUEUED", "instance": None, "labels": {}}]


def test_table_has_upper_headers_one_row_per_document_and_dashes_for_nothing():
    lines = to_text(DOCS, COLS, "table").splitlines()
    assert lines[0].split() == ["ID", "STATE", "NODE"]
    assert lines[1].split() == ["a1", "ACTIVE", "n1"]
    assert lines[2].split() == ["b2", "QUEUED", "-"]


def test_wide_adds_its_columns_after_the_table_ones():
    lines = to_text(DOCS, COLS, "wide").splitlines()
    assert lines[0].split() == ["ID", "STATE", "NODE", "LABELS"]
    assert lines[1].split()[-1] == "team=ml"


def test_json_and_yaml_carry_the_documents_unchanged():
    assert json.loads(to_text(DOCS, COLS, "json")) == {"items": DOCS}
    assert yaml.safe_load(to_text(DOCS, COLS, "yaml")) == {"items": DOCS}
    assert json.loads(to_text(DOCS[0], COLS, "json", single=True)) == DOCS[0]


def test_name_prints_one_key_a_line():
    assert to_text(DOCS, COLS, "name") == "a1\nb2"
    assert to_text([{"name": "vm.1gpu"}], Columns((), key="name"), "name") == "vm.1gpu"


def test_an_empty_table_says_so():
    assert to_text([], COLS, "table") == "No resources found."


def test_cells():
    assert cell(None) == "-" and cell(True) == "yes" and cell([1, 2]) == "1,2" and cell({}) == "-"


def test_every_noun_of_the_root_loads_and_its_help_line_is_its_own():
    from cli.app import NOUNS, load_noun
    for name, (_, _, help_line) in NOUNS.items():
        command = load_noun(name)
        assert command is not None and command.name == name
        assert (command.help or "").split("\n")[0].strip() == help_line, name
