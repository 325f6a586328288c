"""What storage does on its own, not in answer to a message: the classes on offer (once, at start, on every
replica: a repeated announcement changes nothing) and the usage report (every ``usage_interval_s``, on the
leader only, the kit's leadership ``storage``: one ``storage.usage_reported`` per tenant and period, not one
per replica, and a standby takes over when the leader dies).

Each unit of work is opened with ``begin`` (no causing message: each names its own correlation id) and
published through the outbox.
"""
from __future__ import annotations

from functools import partial

from shared.runtime import Runtime
from shared.unit_of_work import UnitOfWork

from .. import handlers
from ..domain.model import StoragePolicy
from ..handlers.lifecycle import Backends


def wire(rt: Runtime, policy: StoragePolicy, backends: Backends, usage_interval_s: float) -> None:
    def begin():
        return UnitOfWork.begin(rt.pool, rt.outbox, name="storage.background")
    rt.background(partial(handlers.announce_classes, begin, policy))
    rt.every(usage_interval_s, partial(handlers.report_usage, begin, backends), leader="storage", at_once=True)
