"""The redfish driver: a bare-metal node (one physical server) provisioned through its BMC over Redfish, booting
a per-allocation ISO from virtual media (``driver``, ``bmc``, ``media``, ``config``)."""
