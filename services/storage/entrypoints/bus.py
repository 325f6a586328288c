"""Storage's subscribers: wire message → handler, nothing else."""
from __future__ import annotations

from functools import partial

from shared.runtime import Runtime

from .. import handlers
from ..domain.model import StoragePolicy


def wire(rt: Runtime, policy: StoragePolicy) -> None:
    rt.consumers.subscribe("storage.provision_volume",
                           partial(handlers.provision_volume, policy=policy, sim_faults=rt.settings.sim_faults))
    rt.consumers.subscribe("storage.delete_volume", handlers.delete_volume)
