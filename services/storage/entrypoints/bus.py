"""Storage's subscribers: wire message → handler, nothing else (what it does on its own: loops.py).

Every handler that calls a backend handles one message per transaction (``batch_size=1``): a backend call is
slow next to a database write, and a batch would hold its locks across all of them.
"""
from __future__ import annotations

from functools import partial

from shared.runtime import Runtime

from .. import handlers
from ..contracts import PROVISION_VOLUME
from ..domain.model import StoragePolicy
from ..handlers.lifecycle import Backends


def wire(rt: Runtime, policy: StoragePolicy, backends: Backends) -> None:
    rt.consumers.participate(PROVISION_VOLUME, batch_size=1,
                             invoke=partial(handlers.provision_volume, policy=policy, backends=backends,
                                            sim_faults=rt.settings.sim_faults),
                             undo=partial(handlers.delete_volume, backends=backends))
    rt.consumers.subscribe("storage.create_volume", partial(handlers.create_volume, policy=policy, backends=backends),
                           on_refused=handlers.refused, batch_size=1)
    rt.consumers.subscribe("storage.resize_volume", partial(handlers.resize_volume, policy=policy, backends=backends),
                           on_refused=handlers.refused, batch_size=1)
    rt.consumers.subscribe("storage.destroy_volume", partial(handlers.destroy_volume, backends=backends),
                           on_refused=handlers.refused, batch_size=1)
    rt.consumers.subscribe("storage.attach_volume", partial(handlers.attach_volume, backends=backends),
                           on_refused=handlers.refused, batch_size=1)
    rt.consumers.subscribe("storage.detach_volume", partial(handlers.detach_volume, backends=backends),
                           on_refused=handlers.refused, batch_size=1)
    rt.consumers.subscribe("node_agent.volume_mount_changed",
                           partial(handlers.volume_mount_changed, backends=backends), batch_size=1)
    rt.consumers.subscribe("storage.set_quota", partial(handlers.set_quota, policy=policy))
