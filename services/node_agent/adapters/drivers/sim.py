"""In-memory driver for the sim platform and the tests: configurable latency and injected failures.

Environment: TESSERA_SIM_LATENCY_S, seconds an operation takes, either one
float for the two changing operations, provision and deprovision ("2.5"), or
per operation ("provision=3,deprovision=0.5,list_instances=0.1"); listing stays
instant unless named, so readiness probes and the gauge are not slowed down;
TESSERA_SIM_FAIL, a comma list of operations that always fail ("provision").
Nothing survives the process: a restarted sim node is empty.

Volumes are real: a sim instance's slots are network-namespace slots, and each btrfs volume is bind mounted in
the allocation's own mount namespace (``namespaces``; TESSERA_VOLUME_ROOTS, TESSERA_VOLUME_STATE_DIR in
``volumes``); an appliance's volume is rendered only. An allocation without volumes touches no namespace, so the
sim needs no privilege unless volumes are asked for. The namespaces outlive the process: a deprovision after a
restart still takes them away.
"""
from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable, Mapping

from ...domain.model import Instance, InstanceSpec
from ...domain.volumes import MountedVolume, Volume
from .base import Console, DriverConfigError, DriverError, PowerAction, ProvisioningDriver
from .namespaces import MountNamespaces
from .volumes import VolumeConfig

OPERATIONS = ("provision", "deprovision", "list_instances")
CHANGING = ("provision", "deprovision")   # what a bare latency figure applies to


def _check_operations(ops: Iterable[str], what: str) -> None:
    unknown = sorted(set(ops) - set(OPERATIONS))
    if unknown:
        raise DriverConfigError(f"{what}: unknown operation(s) {unknown}; operations are {list(OPERATIONS)}")


def parse_latency(text: str) -> dict[str, float]:
    """'2.5' (provision and deprovision) or 'provision=3,deprovision=0.5'; raises DriverConfigError."""
    try:
        if "=" not in text:
            return dict.fromkeys(CHANGING, float(text))
        pairs = [part.split("=", 1) for part in text.split(",") if part.strip()]
        latency = {op.strip(): float(seconds) for op, seconds in pairs}
    except ValueError:
        raise DriverConfigError(f"TESSERA_SIM_LATENCY_S={text!r}: expected seconds, e.g. '2.5' or 'provision=3'") from None
    _check_operations(latency, "TESSERA_SIM_LATENCY_S")
    return latency


class SimDriver(ProvisioningDriver):
    """Keeps instances in a dict; an operation sleeps its latency, then fails if told to, then acts."""

    name = "sim"
    devices_simulated = True

    def __init__(self, latency_s: float | Mapping[str, float] = 0.0, fail: Iterable[str] = (),
                 volumes: MountNamespaces | None = None):
        latency = dict.fromkeys(CHANGING, latency_s) if isinstance(latency_s, (int, float)) else dict(latency_s)
        _check_operations(latency, "latency")
        if any(seconds < 0 for seconds in latency.values()):
            raise DriverConfigError(f"latency must not be negative: {latency}")
        self.fail = frozenset(fail)
        _check_operations(self.fail, "TESSERA_SIM_FAIL")
        self.latency = {op: float(latency.get(op, 0.0)) for op in OPERATIONS}
        self._instances: dict[uuid.UUID, Instance] = {}
        self._stopped: set[uuid.UUID] = set()
        self._addresses: dict[uuid.UUID, list[str]] = {}   # each instance's tenant address, when it was given one
        self.volumes = volumes or MountNamespaces()
        self._mounting: dict[uuid.UUID, asyncio.Lock] = {}

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> SimDriver:
        latency = parse_latency(environ.get("TESSERA_SIM_LATENCY_S") or "0")
        fail = [op.strip() for op in (environ.get("TESSERA_SIM_FAIL") or "").split(",") if op.strip()]
        return cls(latency, fail, MountNamespaces(VolumeConfig.from_env(environ)))

    async def _operate(self, op: str) -> None:
        if self.latency[op] > 0:
            await asyncio.sleep(self.latency[op])
        if op in self.fail:
            raise DriverError(f"sim driver: injected failure of {op}")

    async def provision(self, spec: InstanceSpec) -> str:
        await self._operate("provision")
        async with self._lock(spec.allocation_id):   # racing calls see one instance (and mount once)
            existing = self._instances.get(spec.allocation_id)
            if existing is not None:
                return existing.instance_id
            if spec.volumes:   # a failure leaves no volume behind (attach_all) and no instance
                await asyncio.to_thread(self.volumes.attach_all, spec.allocation_id, spec.volumes)
            instance = Instance(spec.allocation_id, f"sim-{uuid.uuid4().hex[:12]}", tuple(spec.slots))
            self._instances[spec.allocation_id] = instance
            if spec.nic is not None:
                self._addresses[spec.allocation_id] = [spec.nic.interface]
            return instance.instance_id

    async def deprovision(self, allocation_id: uuid.UUID) -> None:
        await self._operate("deprovision")
        async with self._lock(allocation_id):
            await asyncio.to_thread(self.volumes.remove, allocation_id)
        self._instances.pop(allocation_id, None)
        self._stopped.discard(allocation_id)
        self._addresses.pop(allocation_id, None)

    def lose_everything(self) -> list[uuid.UUID]:
        """The node went down (an injected node_down): every instance vanishes at once, unasked. Their volumes'
        namespaces stay, as they would on a host that lost power: a deprovision still takes them away. Returns
        the allocations whose instances vanished."""
        lost = list(self._instances)
        self._instances.clear()
        self._stopped.clear()
        self._addresses.clear()
        return lost

    def _lock(self, allocation_id: uuid.UUID) -> asyncio.Lock:
        if len(self._mounting) > 1024:   # forget idle ones
            self._mounting = {a: lk for a, lk in self._mounting.items() if lk.locked()}
        return self._mounting.setdefault(allocation_id, asyncio.Lock())

    async def mount(self, allocation_id: uuid.UUID, volume: Volume) -> MountedVolume:
        if allocation_id not in self._instances:
            raise DriverError(f"sim driver: no instance of allocation {allocation_id} on this node")
        async with self._lock(allocation_id):
            return await asyncio.to_thread(self.volumes.attach, allocation_id, volume)

    async def unmount(self, allocation_id: uuid.UUID, volume_id: uuid.UUID) -> bool:
        async with self._lock(allocation_id):
            return await asyncio.to_thread(self.volumes.detach, allocation_id, volume_id)

    async def power(self, allocation_id: uuid.UUID, action: PowerAction) -> str:
        if allocation_id not in self._instances:
            raise DriverError(f"sim driver: no instance of allocation {allocation_id} on this node")
        (self._stopped.add if action == "stop" else self._stopped.discard)(allocation_id)
        return "stopped" if allocation_id in self._stopped else "running"

    async def instance_info(self, allocation_id: uuid.UUID) -> dict:
        if allocation_id not in self._instances:
            return {"passthrough": "none"}
        return {"passthrough": "none", "power_state": "stopped" if allocation_id in self._stopped else "running",
                "mounts": [m.info() for m in self.volumes.mounts(allocation_id)],
                "addresses": list(self._addresses.get(allocation_id, []))}

    async def console(self, allocation_id: uuid.UUID, offset: int, limit: int) -> Console | None:
        """A sim instance's console: one line saying what it is (there is no guest)."""
        instance = self._instances.get(allocation_id)
        if instance is None:
            return None
        text = f"sim instance {instance.instance_id}: no guest runs under the sim driver\n".encode()
        start = max(0, len(text) - limit) if offset < 0 else min(offset, len(text))
        chunk = text[start:start + limit]
        return Console(start, start + len(chunk), chunk.decode(), allocation_id not in self._stopped)

    async def list_instances(self) -> list[Instance]:
        await self._operate("list_instances")
        return list(self._instances.values())
