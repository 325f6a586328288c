"""Slot rules of a provisioning request (pure domain)."""
from __future__ import annotations

import pytest

from services.node_agent.domain.model import InvalidRequest, checked_slots


def test_slots_come_back_in_ascending_order():
    assert checked_slots([3, 1, 2]) == (1, 2, 3)


@pytest.mark.parametrize("slots, message", [([], "no slots"), ([0, -1], "negative"), ([1, 1], "twice")])
def test_empty_negative_or_repeated_slots_are_invalid(slots, message):
    with pytest.raises(InvalidRequest, match=message):
        checked_slots(slots)
