"""Domain errors of the Allocation aggregate (pure; the handlers map them to replies or rejections)."""
from __future__ import annotations


class DomainError(Exception):
    """A command does not apply to the aggregate as it stands."""


class IllegalTransition(DomainError):
    """The state machine has no edge from the current state to the requested one."""

    def __init__(self, allocation_id, current: str, target: str, command: str):
        self.current, self.target, self.command = current, target, command
        super().__init__(f"cannot {command} allocation {allocation_id}: it is {current}, "
                         f"and {current} → {target} is not a legal transition")


class InvalidSpec(DomainError):
    """The requested allocation is inconsistent (unknown shape, GPU count not the shape's)."""
