"""The coordinator's own settings, read from the environment in bootstrap (never at import time).

``SagaSettings.from_env()`` builds them, refusing a bad value with a ValueError that names the variable.
The policy's variables are ``PolicySettings`` (their defaults are ``domain.model.Policy``'s);
``shared.settings.describe`` lists the variables of either class, with default and meaning.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from shared.settings import SettingError, integer, load, number, numbers, setting

from .domain.model import Policy


def _step_timeouts(raw: str) -> tuple[tuple[str, float], ...]:
    """'provision_node=600,attach_network=60' (only steps the sagas have)."""
    from .domain.definitions import DEFINITIONS
    known = {n for d in DEFINITIONS.values() for n in d.names}
    pairs = []
    for part in (p.strip() for p in raw.split(",") if p.strip()):
        step, _, seconds = part.partition("=")
        if step.strip() not in known or float(seconds) <= 0:
            raise ValueError(part)
        pairs.append((step.strip(), float(seconds)))
    return tuple({**dict(Policy.step_timeouts), **dict(pairs)}.items())   # the defaults, overridden


_step_timeouts.what = "step=seconds pairs, comma separated, of the sagas' steps (seconds positive)"   # type: ignore[attr-defined]


@dataclass(frozen=True)
class PolicySettings:
    """The variables of the saga policy (``Policy`` checks that the values make sense together)."""

    step_timeout_s: float = setting("TESSERA_SAGA_STEP_TIMEOUT_S", Policy.step_timeout_s, number(positive=True),
                                    doc="wait for a step's reply before it times out")
    compensation_timeout_s: float = setting("TESSERA_SAGA_COMPENSATION_TIMEOUT_S", Policy.compensation_timeout_s,
                                            number(positive=True),
                                            doc="wait for an undo's reply before it is resent")
    compensation_attempts: int = setting("TESSERA_SAGA_COMPENSATION_ATTEMPTS", Policy.compensation_attempts,
                                         integer(1), doc="undo attempts before `saga.compensation_failed`")
    release_attempts: int = setting("TESSERA_SAGA_RELEASE_ATTEMPTS", Policy.release_attempts, integer(1),
                                    doc="attempts per release step before the release saga fails")
    backoff_s: tuple[float, ...] = setting("TESSERA_SAGA_BACKOFF_S", Policy.backoff_s, numbers,
                                           doc="waits between attempts; the last repeats")
    queue_timeout_s: float = setting("TESSERA_SAGA_QUEUE_TIMEOUT_S", Policy.queue_timeout_s, number(positive=True),
                                     doc="how long a queued reservation may wait for capacity")
    step_timeouts: tuple[tuple[str, float], ...] = setting(
        "TESSERA_SAGA_STEP_TIMEOUTS", Policy.step_timeouts, _step_timeouts,
        doc="per-step timeouts overriding TESSERA_SAGA_STEP_TIMEOUT_S, e.g. 'provision_node=600'")
    tenant_inflight: int = setting("TESSERA_SAGA_TENANT_INFLIGHT", Policy.tenant_inflight, integer(1),
                                   doc="allocate sagas one tenant may have in flight; its further requests wait in "
                                       "its own line, first come first served")


@dataclass(frozen=True)
class SagaSettings:
    policy: Policy = field(default_factory=Policy)
    deadline_poll_s: float = setting("TESSERA_SAGA_DEADLINE_POLL_S", 0.2, number(positive=True),
                                     doc="how often the deadline loop looks for passed deadlines")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> SagaSettings:
        """Raises SettingError (a ValueError) naming the variable when a value cannot be used."""
        try:
            policy = Policy(**asdict(load(PolicySettings, environ)))
            return load(cls, environ, policy=policy)
        except SettingError as exc:
            raise SettingError(f"saga settings: {exc}") from None
