"""A slot's address is found where the attachments are stored (``PgNetworkRepository.free_address``, in
PostgreSQL over the network's address index, no row read out), and follows the domain's rule
(``domain.model.free_address``) whatever holes released slots left: checked against the rule on random
layouts of a real database's attachments."""
from __future__ import annotations

import ipaddress
import random
import uuid
from functools import partial

import pytest

from services.network.adapters.repository import PgNetworkRepository
from services.network.bootstrap import build, fabric_from_env
from services.network.domain.model import (
    Attachment,
    NetworkPlan,
    TenantNetwork,
    free_address,
    guid_for,
    mac_for,
    slot_range,
)


class _Undo(Exception):
    """Rolls a layout's rows back once it is checked."""


async def test_the_stored_attachments_give_the_address_the_domains_rule_gives(run_service):
    rt = await run_service("network", partial(build, plan=NetworkPlan(), fabric=fabric_from_env({})))
    rng = random.Random(7)
    cidr = ipaddress.IPv4Network("10.90.0.0/26")            # 61 slot addresses: full layouts are cheap
    first, last = slot_range(cidr)
    slots = [first + i for i in range(int(last) - int(first) + 1)]
    layouts = [[], slots, slots[:-1], slots[1:], [slots[0], slots[2]], slots[:30] + slots[31:]]
    layouts += [rng.sample(slots, rng.randrange(len(slots) + 1)) for _ in range(20)]
    for held in layouts:
        with pytest.raises(_Undo):
            async with rt.pool.acquire() as conn, conn.transaction():
                repo = PgNetworkRepository(conn)
                net = TenantNetwork(uuid.uuid4(), uuid.uuid4(), rng.randrange(10_000, 16_000_000), cidr)
                await repo.add_network(net)
                for ip in held:
                    aid = uuid.uuid4()
                    await repo.add_attachment(Attachment(aid, uuid.uuid4(), net.id, net.vni, ip, mac_for(aid),
                                                         uuid.uuid4(), guid_for(aid)))
                for wanted in (None, rng.choice(slots), *held[:1]):
                    got = await repo.free_address(net.id, first, last, wanted)
                    assert got == free_address(first, last, wanted, held), (sorted(held), wanted)
                raise _Undo
