"""The layout the README promises, held against the tree: one layout in every service, services that reach
each other only through contracts, a runtime kit that holds only what services import."""
from __future__ import annotations

from pathlib import Path

import pytest

from shared.contract import SERVICES
from tests.support.imports import REPO, imported_names, py_files

# Every service: these and nothing else at its top level (a name ending in "/" is a package).
LAYOUT = {"__init__.py", "__main__.py", "contracts", "domain/", "handlers", "adapters/", "entrypoints/",
          "settings.py", "bootstrap.py", "schema/"}
EXTRA = {"gateway": {"http/", "api/", "ui/"}}
# Services whose handlers live elsewhere: the gateway's in its api/ slices (one package per thing a user manages).
WITHOUT = {"gateway": {"handlers"}}
# Services whose only settings are the kit's (shared.settings.ServiceSettings): no settings.py of their own.
KIT_SETTINGS_ONLY = {"allocation"}


def top_level(service: str) -> set[str]:
    names = set()
    for p in (REPO / "services" / service).iterdir():
        if p.name == "__pycache__":
            continue
        if p.name in ("contracts.py", "contracts", "handlers.py", "handlers"):
            names.add(p.stem)
        else:
            names.add(p.name + "/" if p.is_dir() else p.name)
    return names


@pytest.mark.parametrize("service", SERVICES)
def test_every_service_has_the_one_layout(service):
    names = top_level(service)
    expected = (LAYOUT - WITHOUT.get(service, set())) | EXTRA.get(service, set())
    if service in KIT_SETTINGS_ONLY:
        expected = expected - {"settings.py"}
    assert names - expected == set(), f"services/{service} has modules outside the layout"
    assert expected - names == set(), f"services/{service} lacks part of the layout"
    assert (REPO / "services" / service / "entrypoints" / "bus.py").exists()


def test_a_service_reaches_another_only_through_its_contracts():
    breaches = []
    for path in py_files("services"):
        own = path.relative_to(REPO / "services").parts[0]
        for name in imported_names(path):
            parts = name.split(".")
            if parts[0] == "services" and len(parts) > 2 and parts[1] != own and parts[2] != "contracts":
                breaches.append(f"{path.relative_to(REPO)} imports {name}")
    assert breaches == []


def test_no_service_and_nothing_in_the_kit_imports_the_tooling():
    users = [f"{p.relative_to(REPO)}: {n}" for p in py_files("services", "shared") for n in imported_names(p)
             if n == "tooling" or n.startswith("tooling.")]
    assert users == []


def test_the_kit_holds_only_what_services_import():
    kit = {p.stem for p in (REPO / "shared").glob("*.py") if p.stem != "__init__"}
    used = {n.split(".")[1] for p in py_files("services") for n in imported_names(p) if n.startswith("shared.")}
    grown = True
    while grown:   # a kit module may serve services only through other kit modules
        before = len(used)
        for p in (REPO / "shared").glob("*.py"):
            if p.stem in used:
                used |= {n.split(".")[1] for n in imported_names(p) if n.startswith("shared.")}
        grown = len(used) > before
    assert kit - used == set(), "kit modules no service uses belong in tooling/ or with their owner"


GATEWAY_API = "services.gateway.api"


def _gateway_modules(folder: str) -> list[tuple[Path, str]]:
    """(path, dotted name) of every module under services/gateway/<folder>."""
    root = REPO / "services" / "gateway" / folder
    return [(p, ".".join(p.relative_to(REPO).with_suffix("").parts)) for p in py_files(str(root.relative_to(REPO)))]


def _slice_of(name: str) -> str | None:
    """The api/ slice a module name belongs to (None: not in a slice)."""
    parts = name.split(".")
    return parts[3] if name.startswith(GATEWAY_API + ".") and len(parts) > 3 else None


def test_no_gateway_slice_imports_another():
    """A slice reaches what it shares with another through the gateway's lower layer (http/, domain/, adapters/),
    never through the other slice: imports inside functions count too (``imported_names`` walks the whole tree)."""
    breaches = [f"{path.relative_to(REPO)} imports {name}" for path, module in _gateway_modules("api")
                for name in imported_names(path)
                if _slice_of(name) not in (None, _slice_of(module)) and _slice_of(module) is not None]
    assert breaches == []


def test_the_gateway_http_plumbing_imports_no_slice():
    """http/ is plumbing: the route table reaches it as an argument (entrypoints/http.py gathers it)."""
    breaches = [f"{path.relative_to(REPO)} imports {name}" for path, _module in _gateway_modules("http")
                for name in imported_names(path) if name == GATEWAY_API or name.startswith(GATEWAY_API + ".")]
    assert breaches == []
