"""A bare-metal server's network: what its seed tells it, and what its instance reports of it. Pure: no I/O.

The server deploys over the provisioning network (``TESSERA_REDFISH_SERVER_ADDRESS``): it fetches nothing over
it (the BMC does), but it phones home to the node-agent's media server through it. At hand-off the network
service moves the server's switch port to the tenant's VXLAN, so the server's OS must already hold its tenant
address. With a tenant NIC in the spec, the seed's primary address is therefore the tenant's (its gateway the
default route, its MTU the tenant network's or ``TESSERA_REDFISH_TENANT_MTU``), and the provisioning address is
an extra address on the same NIC: its subnet is on-link, so the phone-home reaches a media server on that subnet
without a route (the provisioning gateway is not used then: the default route is the tenant's). Without a tenant
NIC the seed is the provisioning network's alone, as it always was.
"""
from __future__ import annotations

import ipaddress

from ....domain.model import InstanceSpec
from ....domain.vm import cloudinit
from .config import RedfishConfig


def server_seed(spec: InstanceSpec, config: RedfishConfig, *, instance_id: str, mac: str,
                phone_home: str) -> cloudinit.Seed:
    """The seed of the allocation's server. Raises ValueError for a seed that cannot be rendered, or a tenant
    network that overlaps the provisioning network (the server could not tell which one a peer is on)."""
    provisioning, guest, nic = config.server_address, spec.guest, spec.nic
    common = dict(instance_id=instance_id, hostname=guest.hostname, ssh_keys=guest.ssh_keys, mac=mac, dns=guest.dns,
                  phone_home=phone_home)
    if nic is None:
        return cloudinit.Seed(ip_address=str(provisioning.ip), prefix_len=provisioning.network.prefixlen,
                              gateway=str(config.server_gateway) if config.server_gateway else None, **common)
    tenant = ipaddress.IPv4Interface(f"{nic.ip_address}/{nic.prefix_len}")
    if tenant.network.overlaps(provisioning.network):
        raise ValueError(f"the tenant network {tenant.network} overlaps the provisioning network "
                         f"{provisioning.network} (TESSERA_REDFISH_SERVER_ADDRESS)")
    return cloudinit.Seed(ip_address=str(tenant.ip), prefix_len=tenant.network.prefixlen, gateway=nic.gateway,
                          mtu=nic.mtu or config.tenant_mtu, extra_addresses=(str(provisioning),), **common)


def tenant_addresses(spec: InstanceSpec) -> list[str]:
    """The server's addresses on its tenant network ("address/prefix"), as its record keeps them."""
    return [spec.nic.interface] if spec.nic is not None else []


def network_info(config: RedfishConfig, record: dict) -> dict:
    """The instance's network fields: its tenant addresses, the switch port and HCA GUIDs the settings name, and
    the network its port is on (provisioning: the driver hands the server over on it; only with a switch port,
    since without one no network service moves it)."""
    port = config.switch_port
    return {"addresses": list(record.get("addresses", [])),
            "switch_port": {"leaf": port[0], "port": port[1]} if port else None,
            "hca_guids": list(config.hca_guids),
            "network_phase": "provisioning" if port else None}
