"""No import circle inside any service or the kit: every module's imports, those inside functions included, form a
graph without cycles, so each module can be read (and loaded) after the ones it uses and the import order hides
nothing. A package's ``__init__`` counts as a module of its own: a package that re-exports its submodules while
one of them imports the package back is a circle too. Imports under ``if TYPE_CHECKING:`` are left out: they name
types for a checker and are never loaded."""
from __future__ import annotations

from pathlib import Path

import pytest

from shared.contract import SERVICES
from tests.support.imports import imported_names, module_name

REPO = Path(__file__).resolve().parents[2]


def import_graph(root: str) -> dict[str, set[str]]:
    """Module -> the modules of ``root`` it imports (a name resolves to its longest module prefix)."""
    modules = {module_name(p): p for p in (REPO / root).rglob("*.py") if "__pycache__" not in p.parts}
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
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


@pytest.mark.parametrize("root", [f"services/{s}" for s in SERVICES] + ["shared"])
def test_no_import_circle(root):
    assert circles(import_graph(root)) == []


def test_the_circle_finder_finds_a_circle_through_a_package_and_its_submodule():
    graph = {"p": {"p.a"}, "p.a": {"p.b"}, "p.b": {"p"}, "q": {"p"}}
    assert circles(graph) == [["p", "p.a", "p.b"]]
    assert circles({"a": {"b"}, "b": set()}) == []
