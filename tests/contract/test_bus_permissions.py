"""The committed NATS permissions (contracts/asyncapi/nats-permissions.json) are what the contract catalog generates."""
from __future__ import annotations

from tooling import bus_permissions


def test_committed_nats_permissions_equal_the_generated_ones():
    problems = bus_permissions.differences(bus_permissions.DEFAULT_FILE)
    assert not problems, ("contracts/asyncapi/nats-permissions.json is out of date; run "
                          "`python -m tooling.bus_permissions` and commit it:\n" + "\n".join(problems))
