"""The code map committed in docs/architecture.md is what the code generates (``./taskw docs:gen``), and every
saga step, bus consumer and route in it is resolved to a function."""
from __future__ import annotations

from tooling import codemap


def test_the_committed_code_map_equals_the_generated_one():
    problems = codemap.differences(codemap.DOC)
    assert not problems, ("the code map in docs/architecture.md is out of date; run `./taskw docs:gen` and commit "
                          "it:\n" + "\n".join(problems))


def test_every_handler_in_the_code_map_is_resolved():
    unresolved: set[str] = set()
    codemap.generate(unresolved=unresolved)
    assert not unresolved, "the code map could not resolve:\n" + "\n".join(sorted(unresolved))


def test_a_route_is_grouped_by_its_slice_else_by_its_module():
    assert codemap._route_group("services/gateway/api/allocations/routes.py") == "allocations"
    assert codemap._route_group("services/gateway/http/openapi.py") == "services/gateway/http/openapi.py"
    assert codemap._route_group("services/gateway/handlers/nodes.py") == "services/gateway/handlers/nodes.py"
