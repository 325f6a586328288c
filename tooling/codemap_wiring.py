"""Which function each service runs for each message it receives, found by calling its wiring with a recording
runtime (for ``tooling.codemap``).

A service registers its handlers in its ``entrypoints`` modules, in functions that take the runtime first
(``wire(rt, ...)``, the gateway's ``create_app(rt, ...)``). Each such function is called with ``_Runtime``, which
records every durable consumer (``rt.consumers.subscribe``; ``participate`` is the kit's own, so a step's command
and undo are recorded as the kit splits them), every per-process listener (``rt.listen``) and every request it
answers (``rt.answer``), and starts nothing. Every other argument (settings, adapters, a node) is a ``_Stub``:
nothing is built, nothing connects.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.consumer import Consumers
from shared.contract import SERVICES, Catalog

ROOT = Path(__file__).resolve().parent.parent
_STUB_ID = "00000000-0000-4000-8000-000000000000"


@dataclass(frozen=True)
class Wired:
    service: str
    type: str
    kind: str                # "consumer", "listener" or "responder"
    where: str               # ``path:function``, or the handler's repr when it cannot be resolved


def relative(path: str | Path) -> str:
    try:
        return Path(path).resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return Path(path).as_posix()


def resolve(handler: Any) -> Any:
    """The function behind ``handler``: through partials, decorators (``__wrapped__``), and a lambda that only
    calls one named function (``lambda req: handlers.read_console(node, pool, req)``)."""
    for _ in range(10):
        if isinstance(handler, functools.partial):
            handler = handler.func
        elif hasattr(handler, "__wrapped__"):
            handler = inspect.unwrap(handler)
        elif getattr(handler, "__name__", "") == "<lambda>":
            target = _called_by_lambda(handler)
            if target is None:
                return handler
            handler = target
        else:
            return handler
    return handler


def _called_by_lambda(func: Any) -> Any:
    """The function a lambda calls, when its code names one global path (``module.function``)."""
    names = func.__code__.co_names
    if not names or names[0] not in func.__globals__:
        return None
    target = func.__globals__[names[0]]
    for name in names[1:]:
        if not hasattr(target, name):
            break
        target = getattr(target, name)
    return target if callable(target) and not inspect.ismodule(target) else None


def where(handler: Any) -> str | None:
    """``path:qualified name`` of the handler's function, or None."""
    func = resolve(handler)
    try:
        path = inspect.getsourcefile(func)
    except TypeError:
        return None
    qualname = getattr(func, "__qualname__", None)
    if path is None or qualname is None:
        return None
    return f"{relative(path)}:{qualname}"


class _Stub:
    """Any argument of a wiring function besides the runtime. Any attribute, item or call is another stub; it is
    truthy, larger than anything (so a guarded registration, ``if config.cut_s > 0``, is mapped), a stub again under
    arithmetic (``seconds / 4``) and equal only to itself (``kind == "none"`` is false); its text is a well-formed
    node id (node-agents name durables after it)."""

    def __getattr__(self, name: str) -> _Stub:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Stub()

    def __call__(self, *_a: Any, **_k: Any) -> _Stub:
        return _Stub()

    def __getitem__(self, _key: Any) -> _Stub:
        return _Stub()

    def __setitem__(self, _key: Any, _value: Any) -> None:
        pass

    def __iter__(self):
        return iter(())

    def __len__(self) -> int:
        return 0

    def __bool__(self) -> bool:
        return True

    def __gt__(self, _other: Any) -> bool:
        return True

    __ge__ = __gt__

    def __lt__(self, _other: Any) -> bool:
        return False

    __le__ = __lt__

    def __eq__(self, other: Any) -> bool:
        return other is self

    __hash__ = object.__hash__

    def __str__(self) -> str:
        return _STUB_ID

    def _arithmetic(self, *_other: Any) -> _Stub:
        return _Stub()

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _arithmetic
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = __neg__ = _arithmetic

    def __int__(self) -> int:
        return 1

    __index__ = __int__

    def __float__(self) -> float:
        return 1.0


class _Consumers(Consumers):
    """The kit's consumers, recording instead of consuming (``participate`` and the rest are the kit's own)."""

    # super().__init__ is not called on purpose: the kit's wants a broker, an outbox and a pool, none of which recording needs
    def __init__(self, service: str, catalog: Catalog, record: list[tuple[str, Any, str]]):
        self.service, self.catalog, self._record = service, catalog, record
        self.names = []

    def subscribe(self, type_: str, handler: Any, **_options: Any) -> str:
        self.catalog.check_receive(self.service, type_)
        self._record.append((type_, handler, "consumer"))
        return type_


class _Runtime:
    """A runtime that records what a service registers, and starts nothing (``shared.runtime.Runtime``'s calls)."""

    def __init__(self, service: str, catalog: Catalog):
        self.service, self.catalog = service, catalog
        self.record: list[tuple[str, Any, str]] = []
        self.consumers = _Consumers(service, catalog, self.record)
        self.settings = _Stub()

    def listen(self, type_: str, callback: Any) -> None:
        self.catalog.check_receive(self.service, type_)
        self.record.append((type_, callback, "listener"))

    def answer(self, type_: str, handler: Any, **_params: Any) -> None:
        self.record.append((type_, handler, "responder"))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Stub()   # http, pool, outbox, every, background, readiness, on_stop, ...


def _wiring_functions(service: str, problems: set[str]) -> list[tuple[str, Any]]:
    """(qualified name, function) of each plain function of the service's entrypoints that takes the runtime first;
    a module that cannot be imported is named in ``problems``."""
    package = importlib.import_module(f"services.{service}.entrypoints")
    found = []
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        try:
            module = importlib.import_module(f"{package.__name__}.{info.name}")
        except Exception as exc:   # noqa: BLE001 -- the map shows the type names; the problem is reported
            problems.add(f"{package.__name__}.{info.name} cannot be imported: {exc!r}")
            continue
        for name, func in vars(module).items():
            if not inspect.isfunction(func) or func.__module__ != module.__name__ or name.startswith("_"):
                continue
            if inspect.iscoroutinefunction(func) or inspect.isasyncgenfunction(func):
                continue
            params = list(inspect.signature(func).parameters.values())
            if params and params[0].name == "rt":
                found.append((f"{module.__name__}.{name}", func))
    return found


def _call(func: Any, rt: _Runtime) -> None:
    args, kwargs = [rt], {}
    for param in list(inspect.signature(func).parameters.values())[1:]:
        if param.default is not inspect.Parameter.empty:
            continue
        if param.kind is inspect.Parameter.KEYWORD_ONLY:
            kwargs[param.name] = _Stub()
        elif param.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            args.append(_Stub())
    func(*args, **kwargs)


def wiring(catalog: Catalog, problems: set[str]) -> dict[tuple[str, str], list[Wired]]:
    """(service, message type) → what the service runs for it, in registration order. A wiring function that
    fails is named in ``problems`` (what it registered before failing is kept)."""
    found: dict[tuple[str, str], list[Wired]] = {}
    for service in SERVICES:
        for name, func in _wiring_functions(service, problems):
            rt = _Runtime(service, catalog)
            try:
                _call(func, rt)
            except Exception as exc:   # noqa: BLE001 -- the map shows the type name; the problem is reported
                problems.add(f"{name} could not be called with a recording runtime: {exc!r}")
            for type_, handler, kind in rt.record:
                at = where(handler)
                if at is None:
                    problems.add(f"{service}'s handler of {type_}: {handler!r}")
                entry = Wired(service, type_, kind, at or type_)
                if entry not in found.setdefault((service, type_), []):
                    found[(service, type_)].append(entry)
    return found


if __name__ == "__main__":   # a quick look: python -m tooling.codemap_wiring
    from shared.contract import load_catalog
    issues: set[str] = set()
    for (svc, t), ws in wiring(load_catalog(), issues).items():
        print(svc, t, [w.where for w in ws])
    print("\n".join(sorted(issues)), file=sys.stderr)
