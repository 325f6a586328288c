"""The bare-metal lab (a server behind a sushy-emulator BMC) the redfish tests use: ``tooling.bmc_lab``, which
``./taskw up``'s bare-metal demo node shares."""
from tooling.bmc_lab import (
                             SEABIOS,
                             URI,
                             USERNAME,
                             BmcLab,
                             SushyEmulator,
                             define_server,
                             domain_state,
                             free_port,
                             free_subnet,
                             make_bridge,
                             make_loop_disk,
                             make_pool,
                             remove_bridge,
                             remove_loop_disk,
                             remove_pool,
                             remove_server,
                             server_xml,
)

__all__ = ["SEABIOS", "URI", "USERNAME", "BmcLab", "SushyEmulator", "define_server", "domain_state", "free_port",
           "free_subnet", "make_bridge", "make_loop_disk", "make_pool", "remove_bridge", "remove_loop_disk",
           "remove_pool", "remove_server", "server_xml"]
