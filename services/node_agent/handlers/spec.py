"""The driver's view of a provision command (``InstanceSpec``): the domain's types from the contract's, refusing
a detail no driver can use (InvalidRequest)."""
from __future__ import annotations

from .. import contracts as c
from ..domain.dataplane.names import slot_port_name
from ..domain.model import BootImage, GuestConfig, InstanceSpec, InvalidRequest, NicConfig, checked_slots
from ..domain.vm.domain_xml import SlotDevices
from ..domain.volumes import Volume, check_distinct


def _guest(guest: c.Guest | None) -> GuestConfig | None:
    if guest is None:
        return None
    i = guest.image
    return GuestConfig(BootImage(i.name, i.format, i.source, i.sha256, i.min_disk_gb, i.kernel, i.initrd, i.kernel_args),
                       guest.hostname, tuple(guest.ssh_keys), tuple(guest.dns))


def _nic(cmd: c.ProvisionNode, mtu: int | None) -> NicConfig | None:
    att, tenant = cmd.attachment, cmd.tenant_networks
    if att is None:
        return None
    gateway = next((n.gateway_ip for n in (tenant.networks if tenant else []) if n.network_id == att.network_id), None)
    return NicConfig(slot_port_name(att.attachment_id), att.mac_address.lower(), att.ip_address, att.prefix_len, gateway,
                     mtu)


def instance_spec(cmd: c.ProvisionNode, mtu: int | None = None) -> InstanceSpec:
    """The driver's view of the command; raises InvalidRequest (the step fails) for a detail no driver can use."""
    try:
        devices = tuple(SlotDevices(d.index, d.gpu_pci, d.nvme_pci, d.ib_vf_pci, d.ib_guid, d.numa, d.cpu_cores,
                                    d.memory_gb) for d in cmd.slot_details)
    except ValueError as exc:
        raise InvalidRequest(f"slot details: {exc}") from None
    return InstanceSpec(cmd.allocation_id, cmd.tenant_id, cmd.node_id, checked_slots(cmd.slots),
                        cmd.volume_id, cmd.ip_address, cmd.mac_address, devices, _guest(cmd.guest), _nic(cmd, mtu),
                        volumes(cmd.volumes))


def volumes(exports) -> tuple[Volume, ...]:
    """The domain's view of storage's exports; raises InvalidRequest for one no node can mount (or a clash)."""
    try:
        return check_distinct(Volume.of(e.volume_id, e.name, e.mode, e.backend, e.source, e.options) for e in exports)
    except ValueError as exc:
        raise InvalidRequest(f"volumes: {exc}") from None
