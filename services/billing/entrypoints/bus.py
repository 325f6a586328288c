"""Billing's subscribers and loops: wire message → handler, nothing else."""
from __future__ import annotations

from functools import partial

from shared.runtime import Runtime

from .. import handlers
from ..handlers import rating
from ..contracts import START_METER


def wire(rt: Runtime, *, checkpoint_every_s: float) -> None:
    rt.consumers.participate(START_METER, invoke=partial(handlers.start_meter, sim_faults=rt.settings.sim_faults),
                             undo=handlers.stop_meter)
    rt.consumers.subscribe("billing.publish_price_list", handlers.publish_price_list)
    rt.consumers.subscribe("storage.volume_changed", rating.on_volume_changed)
    rt.consumers.subscribe("storage.usage_reported", rating.on_usage_reported)
    if checkpoint_every_s > 0:
        rt.background(partial(rating.checkpoint_forever, rt, checkpoint_every_s))
