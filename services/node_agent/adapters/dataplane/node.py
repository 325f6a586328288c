"""A node's dataplane: what the node-agent calls to plumb, unplumb and repair tenant networks.

``KernelDataplane`` keeps the node's desired inputs (latest snapshot per tenant,
attachment per allocation) in memory; the node-agent persists them and loads
them back at start (``load``). Every operation blocks (netlink, nft) and is
idempotent; operations are serialised by a lock, so calling them from worker
threads (``asyncio.to_thread``) is safe. A failing attach or update puts back
the previous state before raising, so nothing half-made stays in the kernel.
"""
from __future__ import annotations

import abc
import threading
import uuid
from collections.abc import Iterable

import structlog

from services.network.contracts import SlotAttachment, TenantNetworks

from ...domain.dataplane.model import DesiredNode, desired_state
from ...domain.dataplane.reconcile import Repair, plan
from .kernel import Kernel
from .observe import observe
from .repair import apply as apply_repairs

log = structlog.get_logger()


class Dataplane(abc.ABC):
    """The node's network plumbing; every method may block and is idempotent."""

    kind = "abstract"

    def load(self, tenants: Iterable[TenantNetworks], attachments: Iterable[tuple[uuid.UUID, SlotAttachment]]) -> None:
        """Set the desired inputs (after a restart) without touching the kernel."""

    @abc.abstractmethod
    def attach(self, tenant: TenantNetworks, attachment: SlotAttachment) -> None:
        """Plumb the attachment (and its tenant's networks, router and rules); raises InvalidAttachment, KernelError."""

    @abc.abstractmethod
    def detach(self, allocation_id: uuid.UUID) -> bool:
        """Remove what attach made for the allocation; False when it had nothing here."""

    @abc.abstractmethod
    def update_tenant(self, tenant: TenantNetworks) -> bool:
        """Keep a newer snapshot and re-plumb the tenant's networks and rules if it has slots here;
        False when the snapshot is not newer than the one kept (ignored)."""

    @abc.abstractmethod
    def reconcile(self) -> list[Repair]:
        """Repair the kernel towards the desired state; returns what it repaired."""

    def plug(self, allocation_id: uuid.UUID) -> bool:
        """Plug the allocation's VM tap (made when its VM started) into its network; False: nothing to plug."""
        return False

    def guest_mtu(self) -> int | None:
        """The MTU a guest's NIC must use on this node's tenant networks (None: nothing plumbed, its default)."""
        return None

    def close(self) -> None:
        """Release kernel sockets (the kernel objects stay: they outlive the agent)."""


class NullDataplane(Dataplane):
    """TESSERA_NODE_DATAPLANE=none: the node plumbs nothing (sim platforms, machines without root)."""

    kind = "none"

    def attach(self, tenant: TenantNetworks, attachment: SlotAttachment) -> None:
        return None

    def detach(self, allocation_id: uuid.UUID) -> bool:
        return False

    def update_tenant(self, tenant: TenantNetworks) -> bool:
        return False

    def reconcile(self) -> list[Repair]:
        return []


class KernelDataplane(Dataplane):
    """Real kernel objects on the node (requires root)."""

    kind = "kernel"

    def __init__(self, kernel: Kernel, guest_ports: bool = False):
        self.kernel = kernel
        self.guest_ports = guest_ports   # slots are VM taps (libvirt driver), plugged once their VM runs
        self.tenants: dict[uuid.UUID, TenantNetworks] = {}
        self.attachments: dict[uuid.UUID, tuple[uuid.UUID, SlotAttachment]] = {}
        self._lock = threading.RLock()

    def load(self, tenants, attachments) -> None:
        with self._lock:
            for tenant in tenants:
                self._keep(tenant)
            self.attachments.update({att.allocation_id: (tid, att) for tid, att in attachments})

    def _keep(self, tenant: TenantNetworks) -> bool:
        known = self.tenants.get(tenant.tenant_id)
        if known is not None and known.version >= tenant.version:
            return False
        self.tenants[tenant.tenant_id] = tenant
        return True

    def desired(self) -> DesiredNode:
        return desired_state(self.kernel.tag, self.tenants, self.attachments.values(), self.guest_ports)

    def _transition(self, change) -> None:
        """Apply ``change`` (mutates the inputs) and converge the kernel from the old desired state to the new;
        on any failure restore the inputs and converge back, then re-raise."""
        tenants, attachments = dict(self.tenants), dict(self.attachments)
        old = self.desired()
        try:
            change()
            new = self.desired()
        except Exception:
            self.tenants, self.attachments = tenants, attachments
            raise
        was = {key: obj.fp for key, obj in old.objects().items()}
        try:
            apply_repairs(self.kernel, new, plan(was, new))
        except Exception:
            self.tenants, self.attachments = tenants, attachments
            now = {key: obj.fp for key, obj in new.objects().items()}
            try:
                apply_repairs(self.kernel, old, plan(now, old))
            except Exception as undo_exc:  # noqa: BLE001 -- any failure: the periodic reconcile finishes the job
                log.error("dataplane.rollback_failed", error=repr(undo_exc))
            raise

    def attach(self, tenant: TenantNetworks, attachment: SlotAttachment) -> None:
        with self._lock:
            def change():
                self._keep(tenant)
                self.attachments[attachment.allocation_id] = (tenant.tenant_id, attachment)
            self._transition(change)

    def detach(self, allocation_id: uuid.UUID) -> bool:
        with self._lock:
            if allocation_id not in self.attachments:
                return False
            self._transition(lambda: self.attachments.pop(allocation_id))
            return True

    def update_tenant(self, tenant: TenantNetworks) -> bool:
        with self._lock:
            known = self.tenants.get(tenant.tenant_id)
            if known is not None and known.version >= tenant.version:
                return False
            self._transition(lambda: self._keep(tenant))
            return True

    def observe(self) -> dict[tuple[str, str], str]:
        with self._lock:
            return observe(self.kernel)

    def guest_mtu(self) -> int | None:
        with self._lock:
            _ = self.kernel.ipr   # opened on first use: it reads the underlay's MTU
            return self.kernel.mtu

    def plug(self, allocation_id: uuid.UUID) -> bool:
        """Plug the allocation's VM tap into its bridge (guest ports only; the VM has just started). False when
        the allocation has no attachment here or its tap does not exist."""
        with self._lock:
            slot = self.desired().slots.get(allocation_id)
            return bool(self.guest_ports and slot is not None and self.kernel.plug_tap(slot))

    def reconcile(self) -> list[Repair]:
        with self._lock:
            desired = self.desired()
            if self.guest_ports:   # a VM that is not running has no tap, a VM just started is being plugged:
                desired.slots = {a: s for a, s in desired.slots.items() if self.kernel.tap_plugged_before(s.port)}
            repairs = plan(observe(self.kernel), desired)
            apply_repairs(self.kernel, desired, repairs)
            return repairs

    def close(self) -> None:
        self.kernel.close()
