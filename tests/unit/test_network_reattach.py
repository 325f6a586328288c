"""An allocation re-attached on another node keeps its address when it can (what a reschedule needs): the
address wish of the attach command, the domain's rule for granting it, and the handlers over an in-memory
repository (no I/O)."""
from __future__ import annotations

import ipaddress
import uuid

import pytest
from pydantic import ValidationError

from services.network import contracts as c
from services.network import handlers
from services.network.domain.model import NetworkPlan, free_address, slot_range, wanted_slot_address
from shared.wire import step_key
from tests.support.fakes import FakeUnitOfWork, factory
from tests.support.network_fakes import FakeNetworkRepository, RecordingFabric
from tests.support.steps import StepConnection

TENANT, N1, N2 = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
PLAN = NetworkPlan()
NET = ipaddress.IPv4Network("10.0.0.0/24")


# --- the domain's rule ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("wanted,used,got", [
    ("10.0.0.7", [], "10.0.0.7"),
    ("10.0.0.2", [], "10.0.0.2"),               # the first slot address
    ("10.0.0.254", [], "10.0.0.254"),           # the last host
    ("10.0.0.7", ["10.0.0.7"], "10.0.0.2"),     # another slot holds it: the lowest free one
    ("10.0.0.7", ["10.0.0.7", "10.0.0.2"], "10.0.0.3"),
    ("10.0.0.1", [], "10.0.0.2"),               # the gateway: not a wish a slot can have
    ("10.0.0.0", [], "10.0.0.2"),               # the network address
    ("10.0.0.255", [], "10.0.0.2"),             # the broadcast address
    ("10.0.1.7", [], "10.0.0.2"),               # outside the subnet
    ("2001:db8::7", [], "10.0.0.2"),            # tenant subnets are IPv4
    (None, [], "10.0.0.2"),                     # no wish
])
def test_an_address_is_kept_only_when_it_is_a_free_slot_host_of_the_subnet(wanted, used, got):
    wish = wanted_slot_address(NET, wanted)
    assert free_address(*slot_range(NET), wish, [ipaddress.IPv4Address(u) for u in used]) == ipaddress.IPv4Address(got)


# --- the contract ------------------------------------------------------------------------------------------------
def attach_cmd(alloc: uuid.UUID, node: uuid.UUID, ip_address: str | None = None, **kw) -> c.AttachNetwork:
    saga = uuid.uuid4()
    return c.AttachNetwork(saga_id=saga, step="attach_network", idempotency_key=step_key(saga, "attach_network"),
                           allocation_id=alloc, tenant_id=TENANT, node_id=node, ip_address=ip_address, **kw)


def test_the_address_wish_is_any_ip_address_in_canonical_form_and_nothing_else():
    alloc = uuid.uuid4()
    assert attach_cmd(alloc, N1, " 10.0.0.7").ip_address == "10.0.0.7"
    assert attach_cmd(alloc, N1, "2001:DB8::7").ip_address == "2001:db8::7"
    assert attach_cmd(alloc, N1).ip_address is None
    for bad in ("10.0.0.0/24", "10.0.0.256", "host-7", ""):
        with pytest.raises(ValidationError, match="not an IPv4 or IPv6 address"):
            attach_cmd(alloc, N1, bad)


# --- the handlers ------------------------------------------------------------------------------------------------
class World:
    """One in-memory network service: its repository, the participant's outcomes and a recording fabric."""

    def __init__(self) -> None:
        self.repo, self.fabric = FakeNetworkRepository(), RecordingFabric()
        self.conn = StepConnection(self.repo)   # a refused step's savepoint restores the repository

    async def run(self, handler, type_: str, cmd, **kw) -> FakeUnitOfWork:
        uow = FakeUnitOfWork("network", type_, cmd)
        uow.conn = self.conn
        await handler(uow, cmd, repository=factory(self.repo), fabric=[self.fabric], **kw)
        return uow

    async def attach(self, alloc: uuid.UUID, node: uuid.UUID, ip_address: str | None = None) -> FakeUnitOfWork:
        return await self.run(handlers.attach_network, "network.attach_network", attach_cmd(alloc, node, ip_address),
                              plan=PLAN)

    async def attached(self, alloc: uuid.UUID, node: uuid.UUID, ip_address: str | None = None) -> dict:
        uow = await self.attach(alloc, node, ip_address)   # the first also creates the tenant's default network
        assert uow.types()[-1] == "network.network_attached", uow.types()
        return uow.emitted[-1].data

    async def detach(self, alloc: uuid.UUID) -> None:
        saga = uuid.uuid4()
        cmd = c.DetachNetwork(saga_id=saga, step="detach_network", idempotency_key=step_key(saga, "detach_network"),
                              allocation_id=alloc, tenant_id=TENANT)
        (await self.run(handlers.detach_network, "network.detach_network", cmd)).only("network.network_detached")


async def test_a_detached_allocation_re_attached_on_another_node_keeps_its_address_not_the_lowest_free_one():
    world, alloc, neighbour = World(), uuid.uuid4(), uuid.uuid4()
    await world.attached(neighbour, N1)                                       # 10.0.0.2
    first = await world.attached(alloc, N1)
    assert (first["ip_address"], first["kept_address"]) == ("10.0.0.3", True)   # it asked for none
    await world.detach(neighbour)                                             # 10.0.0.2 is the lowest free again
    await world.detach(alloc)
    again = await world.attached(alloc, N2, "10.0.0.3")
    assert (again["ip_address"], again["kept_address"], again["node_id"]) == ("10.0.0.3", True, str(N2))
    assert again["attachment"]["ip_address"] == "10.0.0.3" and again["attachment_id"] != first["attachment_id"]
    [row] = world.repo.attachments.values()
    assert (row.allocation_id, str(row.ip_address), row.node_id) == (alloc, "10.0.0.3", N2)


async def test_the_old_address_is_kept_exactly():
    world, alloc = World(), uuid.uuid4()
    old = (await world.attached(alloc, N1))["ip_address"]
    await world.detach(alloc)
    again = await world.attached(alloc, N2, old)
    assert (again["ip_address"], again["kept_address"]) == (old, True)
    assert [action for action, _ in world.fabric.sent] == ["attach", "detach", "attach"]


async def test_an_address_another_allocation_took_meanwhile_gives_the_next_free_one_and_says_so():
    world, alloc = World(), uuid.uuid4()
    old = (await world.attached(alloc, N1))["ip_address"]
    await world.detach(alloc)
    assert (await world.attached(uuid.uuid4(), N1))["ip_address"] == old       # taken while the slot was away
    again = await world.attached(alloc, N2, old)
    assert again["ip_address"] != old and again["kept_address"] is False
    assert again["ip_address"] == "10.0.0.3"


@pytest.mark.parametrize("wanted", ["10.9.0.7", "10.0.0.1", "10.0.0.255", "2001:db8::7"])
async def test_an_address_the_slot_cannot_have_gives_the_next_free_one_and_says_so(wanted):
    world = World()
    got = await world.attached(uuid.uuid4(), N2, wanted)
    assert (got["ip_address"], got["kept_address"]) == ("10.0.0.2", False)


async def test_an_attach_repeated_on_the_same_node_answers_the_attachment_and_whether_it_has_the_address():
    world, alloc = World(), uuid.uuid4()
    first = await world.attached(alloc, N1, "10.0.0.9")
    same = await world.attached(alloc, N1, "10.0.0.9")
    other = await world.attached(alloc, N1, "10.0.0.10")
    assert first["attachment_id"] == same["attachment_id"] == other["attachment_id"]
    assert (same["ip_address"], same["kept_address"], other["kept_address"]) == ("10.0.0.9", True, False)
    assert len(world.repo.attachments) == 1

