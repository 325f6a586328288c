"""The unit tests' stand-in for the participant kit's connection (tests/support/steps.py) is only worth what its
transaction undoes: a block that raises leaves neither a step outcome nor a change in any fake behind."""
from __future__ import annotations

import pytest

from tests.support.steps import Snapshots, StepConnection


class Ledger(Snapshots):
    def __init__(self) -> None:
        self.rows: list[str] = ["kept"]


async def test_a_block_that_raises_leaves_no_outcome_and_no_change_in_a_fake():
    ledger = Ledger()
    conn = StepConnection(ledger)
    with pytest.raises(RuntimeError):
        async with conn.transaction():
            await conn.execute("INSERT INTO step_outcomes", "k1", "done", "{}")
            ledger.rows.append("lost")
            raise RuntimeError("refused")
    assert conn.status("k1") is None and ledger.rows == ["kept"]


async def test_a_block_that_completes_keeps_its_outcome_and_its_changes():
    ledger = Ledger()
    conn = StepConnection(ledger)
    async with conn.transaction():
        await conn.execute("INSERT INTO step_outcomes", "k1", "done", "{}")
        ledger.rows.append("added")
    assert conn.status("k1") == "done" and ledger.rows == ["kept", "added"]
