"""No import circle inside any service or the kit: every module's imports, those inside functions included, form a
graph without cycles, so each module can be read (and loaded) after the ones it uses and the import order hides
nothing. A package's ``__init__`` counts as a module of its own: a package that re-exports its submodules while
one of them imports the package back is a circle too. Imports under ``if TYPE_CHECKING:`` are left out: they name
types for a checker and are never loaded."""
from __future__ import annotations

import graphlib

import pytest

from shared.contract import SERVICES
from tests.support.imports import imported_names, module_name, py_files


def import_graph(root: str) -> dict[str, set[str]]:
    """Module -> the modules of ``root`` it imports (a name resolves to its longest module prefix)."""
    modules = {module_name(p): p for p in py_files(root)}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for name in imported_names(path, type_checking=False):
            parts = name.split(".")
            target = next((".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in modules),
                          None)
            if target and target != module:
                graph[module].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The modules of an import circle, sorted ([] when there is none): the standard library's topological sort
    finds one, and a circle is fixed one at a time."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        return [sorted(set(exc.args[1]))]
    return []


@pytest.mark.parametrize("root", [f"services/{s}" for s in SERVICES] + ["shared"])
def test_no_import_circle(root):
    assert circles(import_graph(root)) == []


def test_the_circle_finder_finds_a_circle_through_a_package_and_its_submodule():
    graph = {"p": {"p.a"}, "p.a": {"p.b"}, "p.b": {"p"}, "q": {"p"}}
    assert circles(graph) == [["p", "p.a", "p.b"]]
    assert circles({"a": {"b"}, "b": set()}) == []
