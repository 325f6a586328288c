"""Storage's subscribers: wire message → handler, nothing else."""
from __future__ import annotations

from functools import partial

from shared.runtime import Runtime

from .. import handlers
from ..contracts import PROVISION_VOLUME
from ..domain.model import StoragePolicy


def wire(rt: Runtime, policy: StoragePolicy) -> None:
    rt.consumers.participate(PROVISION_VOLUME, undo=handlers.delete_volume,
                             invoke=partial(handlers.provision_volume, policy=policy, sim_faults=rt.settings.sim_faults))
