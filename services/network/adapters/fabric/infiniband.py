"""InfiniBand partitions through NVIDIA UFM's REST API (``/ufmRest``).

Each tenant has one partition (its PKey). The first attachment of the tenant creates the
partition (``POST /ufmRest/resources/pkeys/add``); every attachment adds its slot's VF
GUID as a full member (``POST /ufmRest/resources/pkeys``); a detach removes the GUID
(``POST /ufmRest/actions/remove_guids_from_pkey``) and the tenant's last detach deletes the
partition (``DELETE /ufmRest/resources/pkeys/<pkey>``). A bare-metal server's HCA port GUIDs join the partition
when its port is handed to the tenant and leave it when the port returns to the provisioning network.
"""
from __future__ import annotations

from .base import FabricCall, FabricChange, FabricDriver, PortChange


def pkey_hex(pkey: int) -> str:
    return f"0x{pkey:04x}"


class UfmPartitionDriver(FabricDriver):
    name = "infiniband"

    def __init__(self, base_url: str = "https://ufm.fabric.local"):
        self.base_url = base_url.rstrip("/")

    def attach_calls(self, c: FabricChange) -> list[FabricCall]:
        pkey = pkey_hex(c.pkey)
        calls = []
        if c.tenant_alone:
            calls.append(FabricCall("POST", f"{self.base_url}/ufmRest/resources/pkeys/add",
                                    {"pkey": pkey, "index0": True, "ip_over_ib": True, "mtu_limit": 4,
                                     "service_level": 0, "rate_limit": 300}))
        calls.append(FabricCall("POST", f"{self.base_url}/ufmRest/resources/pkeys",
                                {"pkey": pkey, "guids": [c.guid], "membership": "full", "index0": True,
                                 "ip_over_ib": True}))
        return calls

    def detach_calls(self, c: FabricChange) -> list[FabricCall]:
        pkey = pkey_hex(c.pkey)
        calls = [FabricCall("POST", f"{self.base_url}/ufmRest/actions/remove_guids_from_pkey",
                            {"pkey": pkey, "guids": [c.guid]})]
        if c.tenant_alone:
            calls.append(FabricCall("DELETE", f"{self.base_url}/ufmRest/resources/pkeys/{pkey}", None))
        return calls

    def bind_calls(self, c: PortChange) -> list[FabricCall]:
        if not c.hca_guids or c.pkey is None:
            return []
        return [FabricCall("POST", f"{self.base_url}/ufmRest/resources/pkeys",
                           {"pkey": pkey_hex(c.pkey), "guids": list(c.hca_guids), "membership": "full",
                            "index0": True, "ip_over_ib": True})]

    def unbind_calls(self, c: PortChange) -> list[FabricCall]:
        if not c.hca_guids or c.pkey is None:
            return []
        return [FabricCall("POST", f"{self.base_url}/ufmRest/actions/remove_guids_from_pkey",
                           {"pkey": pkey_hex(c.pkey), "guids": list(c.hca_guids)})]
