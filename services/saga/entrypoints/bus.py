"""The coordinator's subscribers: saga starts, a tenant's withdrawal, and every participant reply in its contract;
and its answer to a read of an allocation's sagas."""
from __future__ import annotations

from functools import partial

from shared.runtime import Runtime

from .. import handlers
from ..contracts import CONTRACT
from ..domain.model import Policy

STARTS = {"allocation.requested": handlers.start_allocate, "allocation.release_requested": handlers.start_release,
          "allocation.interrupted": handlers.start_reschedule}


def wire(rt: Runtime, policy: Policy) -> None:
    rt.consumers.subscribe("saga.withdraw", handlers.withdraw)
    for type_ in (t for t in CONTRACT.receives if t != "saga.withdraw"):
        handler = STARTS.get(type_, handlers.on_reply)
        rt.consumers.subscribe(type_, partial(handler, policy=policy))
    rt.answer("saga.read_steps", partial(handlers.read_steps, rt))
