"""The one way a test waits for something to become true: ``eventually``.

Always bounded (``timeout`` is required), it polls a probe and fails with an AssertionError that says
what it waited for and the last value it saw. A test that can tell early that the awaited outcome will
never come (FAILED while it waits for ACTIVE) says so with ``fail_if`` and stops at once.
"""
from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

_NOT_YET = object()


def describe(fn: Callable) -> str:
    """A short description of a probe or predicate: its source line for a lambda, else its name."""
    if getattr(fn, "__name__", "") == "<lambda>":
        try:
            return " ".join(inspect.getsource(fn).split())[:240]
        except (OSError, TypeError):
            pass
    return getattr(fn, "__qualname__", None) or repr(fn)


async def eventually(probe: Callable[[], Any], *, timeout: float, until: Callable[[Any], bool] | None = None,
                     fail_if: Callable[[Any], bool] | None = None, interval: float = 0.05, what: str | None = None) -> Any:
    """Call ``probe()`` (sync or async) every ``interval`` seconds until its value satisfies ``until`` (by
    default: is truthy), and return that value.

    After ``timeout`` seconds (the probe's own calls included) raise AssertionError naming ``what`` (or the
    probe) and the last value seen. ``fail_if(value)`` true stops at once with an AssertionError: the outcome
    is decided the other way. Exceptions the probe raises propagate unchanged.
    """
    done = until or bool
    last: Any = _NOT_YET
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        async with asyncio.timeout_at(deadline) as cm:
            while True:
                value = probe()
                if inspect.isawaitable(value):
                    value = await value
                last = value
                if done(value):
                    return value
                if fail_if is not None and fail_if(value):
                    raise AssertionError(f"stopped waiting for {what or describe(probe)}: "
                                         f"it will not happen, the value is {value!r}")
                await asyncio.sleep(interval)
    except TimeoutError:
        if not cm.expired():
            raise                         # the probe's own TimeoutError
    seen = "no value (the first probe did not return in time)" if last is _NOT_YET else f"last value {last!r}"
    raise AssertionError(f"waited {timeout}s for {what or describe(probe)}: {seen}")


def eventually_blocking(probe: Callable[[], Any], *, timeout: float, **kw) -> Any:
    """``eventually`` for a synchronous test (it may not run the session's event loop): the same polling,
    run on a loop of a worker thread; ``probe`` must be synchronous."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, eventually(probe, timeout=timeout, **kw)).result()
