"""The node this process serves, as its handlers see it: its id and its ports (driver, dataplane, records, wiper,
burn-in, GPU health probe), the platform key that opens its BMC password, the gate that holds network work until
the stored desired state is loaded, and its health as the heartbeats report it (the faults injected into the
agent, the alerts' start times).

It lives with the handlers because it is their context and nothing else's: not pure (a kernel thread, an asyncio
event), so not domain; no I/O of its own (it only runs its ports'), so not an adapter. The bootstrap builds it,
the entrypoints hand it to every handler.
"""
from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ..adapters.dataplane import Dataplane, KernelError, NullDataplane
from ..adapters.drivers import ProvisioningDriver
from ..domain.health import AgentFaults, AlertBook, GpuHealthProbe, Limits
from ..domain.model import InvalidRequest
from ..domain.ports import BurnIn, NodeRecords, SlotWiper

# The node's records on a unit of work's connection (adapters.records.PgNodeRecords bound to the node's id; a
# fake's in the unit tests).
RecordsFactory = Callable[[Any], NodeRecords]


@dataclass(frozen=True, kw_only=True)
class Node:
    """The node this process serves: its id, its ports, whether sim fault labels apply."""

    id: uuid.UUID
    driver: ProvisioningDriver
    records: RecordsFactory
    wiper: SlotWiper
    burn_in: BurnIn
    sim_faults: bool = False
    dataplane: Dataplane = field(default_factory=NullDataplane)
    # the platform key that opens the BMC password (None: no key configured; a BMC call is then refused)
    secret_key: bytes | None = field(default=None, repr=False)
    # one thread for every kernel call: pyroute2's sync sockets stay on the thread that made them
    kernel_thread: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1, "dataplane"), repr=False)
    # set once the stored desired state is loaded: a command handled before that would be undone by the load
    loaded: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    # health: the GPUs' probe (None: none), the limits their alerts use, the faults injected into the agent
    probe: GpuHealthProbe | None = None
    limits: Limits = field(default_factory=Limits)
    faults: AgentFaults = field(default_factory=AgentFaults, repr=False)
    alerts: AlertBook = field(default_factory=AlertBook, repr=False)
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))

    async def guest_mtu(self) -> int | None:
        """The MTU of the node's tenant networks for a guest NIC (None without a dataplane)."""
        if self.dataplane.kind == "none":
            return None
        try:
            return await self.plumbing(self.dataplane.guest_mtu)
        except KernelError as exc:
            raise InvalidRequest(f"network: {exc}") from exc

    async def plug(self, allocation_id: uuid.UUID) -> None:
        """The driver started the allocation's VM: plug its tap into the tenant network (guest ports only)."""
        if self.dataplane.kind != "none":
            await self.plumbing(self.dataplane.plug, allocation_id)

    async def plumbing(self, fn, *args):
        """Run a blocking dataplane call on the node's kernel thread, once the stored state is loaded."""
        if self.dataplane.kind != "none":
            await self.loaded.wait()
        return await asyncio.get_running_loop().run_in_executor(self.kernel_thread, fn, *args)

    @property
    def subject_params(self) -> dict[str, str]:
        return {"node_id": str(self.id)}

    async def driver_ready(self) -> bool:
        """Readiness: the driver answers (list_instances raises when it cannot reach its hypervisor/BMC)."""
        await self.driver.list_instances()
        return True

    async def slowed(self) -> None:
        """Wait the delay an injected slow_agent fault puts before every heartbeat and command (none: at once)."""
        if self.faults.slow_s:
            await asyncio.sleep(self.faults.slow_s)

    async def close(self) -> None:
        """At stop: release the dataplane's kernel sockets on their thread, then the thread, then the probe."""
        await asyncio.get_running_loop().run_in_executor(self.kernel_thread, self.dataplane.close)
        self.kernel_thread.shutdown(wait=False)
        if self.probe is not None:
            self.probe.close()
