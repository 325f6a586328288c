"""A connection for unit tests of saga participants over fakes: it holds only what the participant kit
(shared.participant) keeps in the database, the step outcomes, so a handler runs through the kit as in
production (one effect per key, tombstones, deferred answers) with no I/O.

Every other statement fails the test: a handler that reaches SQL past its repository port is caught here.
``transaction()`` is a savepoint over the fakes it was given: what they hold is put back when the block raises.
"""
from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import AsyncIterator
from typing import Any


class Snapshots:
    """What a fake repository needs to undo a refused block: ``snapshot``/``restore`` (a deep copy of its
    attributes, less those named in ``unsaved``) for a StepConnection, and a ``savepoint`` that restores it when
    the block raises."""

    unsaved: tuple[str, ...] = ()

    def snapshot(self) -> dict:
        return copy.deepcopy({k: v for k, v in vars(self).items() if k not in self.unsaved})

    def restore(self, state: dict) -> None:
        vars(self).update(state)

    @contextlib.asynccontextmanager
    async def savepoint(self) -> AsyncIterator[None]:
        state = self.snapshot()
        try:
            yield
        except BaseException:
            self.restore(state)
            raise


class StepConnection(Snapshots):
    unsaved = ("fakes",)

    def __init__(self, *fakes: Snapshots):
        self.fakes = fakes
        self.outcomes: dict[str, tuple[str, dict]] = {}

    @contextlib.asynccontextmanager
    async def transaction(self, **_: Any) -> AsyncIterator[None]:
        """A savepoint of the step outcomes and of every fake: each is put back when the block raises."""
        async with contextlib.AsyncExitStack() as savepoints:
            for holder in (self, *self.fakes):
                await savepoints.enter_async_context(holder.savepoint())
            yield

    async def execute(self, sql: str, *args: Any) -> str:
        if sql.startswith("SELECT pg_advisory_xact_lock"):
            return "SELECT 1"
        if sql.startswith("INSERT INTO step_outcomes"):
            # one outcome, or a unit of work's kept outcomes at once (arrays: keys, statuses, results)
            rows = zip(*args) if isinstance(args[0], list) else [args]
            for key, status, result in rows:
                self.outcomes[key] = (status, json.loads(result))
            return "INSERT 0 1"
        raise AssertionError(f"SQL outside the repository port: {sql}")

    async def fetchrow(self, sql: str, *args: Any) -> dict | None:
        if sql.startswith("SELECT status, result FROM step_outcome_locked"):
            found = self.outcomes.get(args[0])
            return None if found is None else {"status": found[0], "result": json.dumps(found[1])}
        raise AssertionError(f"SQL outside the repository port: {sql}")

    def status(self, key: str) -> str | None:
        """The recorded outcome's status of ``key`` (None: never handled)."""
        return self.outcomes[key][0] if key in self.outcomes else None
