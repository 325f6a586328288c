"""The coordinator's own settings, read from the environment in bootstrap (never at import time).

Environment variables (defaults in brackets):
  TESSERA_SAGA_STEP_TIMEOUT_S          [30]   wait for a step's reply before it times out
  TESSERA_SAGA_COMPENSATION_TIMEOUT_S  [10]   wait for an undo's reply before it is resent
  TESSERA_SAGA_COMPENSATION_ATTEMPTS   [5]    undo attempts before saga.compensation_failed
  TESSERA_SAGA_RELEASE_ATTEMPTS        [8]    attempts per release step before the release saga fails
  TESSERA_SAGA_BACKOFF_S               [0.5,1,2,4,8]  waits between attempts; the last one repeats
  TESSERA_SAGA_QUEUE_TIMEOUT_S         [86400] how long a queued reservation may wait for capacity
  TESSERA_SAGA_DEADLINE_POLL_S         [0.2]  how often the deadline loop looks for passed deadlines
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, TypeVar

from .domain.model import Policy

T = TypeVar("T")


@dataclass(frozen=True)
class SagaSettings:
    policy: Policy = field(default_factory=Policy)
    deadline_poll_s: float = 0.2

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> "SagaSettings":
        """Raises ValueError naming the variable when a value cannot be used."""
        def read(name: str, default: str, parse: Callable[[str], T], valid: Callable[[T], bool], what: str) -> T:
            raw = environ.get(name) or default
            try:
                value = parse(raw)
            except ValueError:
                value = None
            if value is None or not valid(value):
                raise ValueError(f"saga settings: {name}={raw!r} is not {what}")
            return value

        def delays(raw: str) -> tuple[float, ...]:
            return tuple(float(x) for x in raw.split(","))

        def positive(x) -> bool:
            return x > 0

        policy = Policy(
            step_timeout_s=read("TESSERA_SAGA_STEP_TIMEOUT_S", "30", float, positive, "a positive number of seconds"),
            compensation_timeout_s=read("TESSERA_SAGA_COMPENSATION_TIMEOUT_S", "10", float, positive,
                                        "a positive number of seconds"),
            compensation_attempts=read("TESSERA_SAGA_COMPENSATION_ATTEMPTS", "5", int, positive, "a positive integer"),
            release_attempts=read("TESSERA_SAGA_RELEASE_ATTEMPTS", "8", int, positive, "a positive integer"),
            backoff_s=read("TESSERA_SAGA_BACKOFF_S", "0.5,1,2,4,8", delays, lambda d: all(x >= 0 for x in d),
                           "a comma-separated list of non-negative seconds"),
            queue_timeout_s=read("TESSERA_SAGA_QUEUE_TIMEOUT_S", "86400", float, positive, "a positive number of seconds"),
        )
        poll = read("TESSERA_SAGA_DEADLINE_POLL_S", "0.2", float, positive, "a positive number of seconds")
        return cls(policy=policy, deadline_poll_s=poll)
