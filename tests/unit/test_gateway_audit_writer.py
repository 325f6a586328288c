"""The audit chain's group commit (services/gateway/http/audit_writer.py), over a stand-in for the append: records
arriving while an append is in flight go together in the next one; a batch that fails is retried record by
record, so only the record that cannot be written fails; each caller returns once its own record is written."""
from __future__ import annotations

import asyncio

import pytest

from services.gateway.http.audit_writer import AuditWriter
from tests.support.polling import eventually


class Recording(AuditWriter):
    """Appends into ``written``, one call per append; the first append waits for ``release``; an entry marked
    ``bad`` makes its append fail."""

    def __init__(self):
        super().__init__(lambda: None, "audit_log")
        self.calls: list[tuple[list[str], str | None]] = []
        self.written: list[str] = []
        self.release = asyncio.Event()

    async def _write(self, entries: list[dict], unique: str | None = None) -> None:
        self.calls.append(([e["id"] for e in entries], unique))
        if len(self.calls) == 1:
            await self.release.wait()
        if any(e.get("bad") for e in entries):
            raise RuntimeError("cannot be written")
        self.written += [e["id"] for e in entries]


async def _until(predicate) -> None:
    await eventually(predicate, timeout=5, interval=0.001)


async def test_records_arriving_during_an_append_are_appended_together_next():
    w = Recording()
    first = asyncio.create_task(w.append({"id": "a"}))
    await _until(lambda: w.calls)
    later = [asyncio.create_task(w.append({"id": i})) for i in ("b", "c", "d")]
    await _until(lambda: len(w._pending) == 3)
    assert not any(t.done() for t in [first, *later])   # nobody returns before its record is written
    w.release.set()
    await asyncio.gather(first, *later)
    assert w.calls == [(["a"], None), (["b", "c", "d"], None)]
    assert w.written == ["a", "b", "c", "d"]


async def test_a_record_that_cannot_be_written_fails_alone():
    w = Recording()
    first = asyncio.create_task(w.append({"id": "a"}))
    await _until(lambda: w.calls)
    later = [asyncio.create_task(w.append({"id": i, "bad": i == "c"})) for i in ("b", "c", "d")]
    await _until(lambda: len(w._pending) == 3)
    w.release.set()
    results = await asyncio.gather(first, *later, return_exceptions=True)
    assert results[:2] == [None, None] and isinstance(results[2], RuntimeError) and results[3] is None
    assert w.written == ["a", "b", "d"]
    # the retries are idempotent by audit_id: a batch whose commit was only acknowledged late is not doubled
    assert w.calls[2:] == [(["b"], "audit_id"), (["c"], "audit_id"), (["d"], "audit_id")]


async def test_a_lone_record_that_fails_fails_its_caller_once():
    w = Recording()
    w.release.set()
    with pytest.raises(RuntimeError):
        await w.append({"id": "a", "bad": True})
    assert w.calls == [(["a"], None)]
    await w.append({"id": "b"})   # the writer goes on
    assert w.written == ["b"]


async def test_a_cancelled_caller_still_has_its_record_written():
    w = Recording()
    waiting = asyncio.create_task(w.append({"id": "a"}))
    await _until(lambda: w.calls)
    waiting.cancel()
    w.release.set()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await _until(lambda: w.written)
    assert w.written == ["a"]
