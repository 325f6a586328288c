"""Billing's subscribers: wire message → handler, nothing else."""
from __future__ import annotations

from functools import partial

from shared.runtime import Runtime

from .. import handlers
from ..contracts import START_METER


def wire(rt: Runtime) -> None:
    rt.consumers.participate(START_METER, invoke=partial(handlers.start_meter, sim_faults=rt.settings.sim_faults),
                             undo=handlers.stop_meter)
