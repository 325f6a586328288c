"""The gateway's per-tenant gate: a tenant's many requests wait behind its own, never another tenant's."""
from __future__ import annotations

import asyncio

from services.gateway.http.fairgate import TenantGate


async def test_a_tenants_burst_waits_behind_its_own_and_another_tenant_goes_in_at_once():
    gate = TenantGate(2)
    await gate.enter("a")
    await gate.enter("a")
    burst = [asyncio.create_task(gate.enter("a")) for _ in range(10)]
    await asyncio.sleep(0)
    assert not any(t.done() for t in burst)
    await asyncio.wait_for(gate.enter("b"), 0.1)       # b's request does not wait for any of a's
    assert (gate.busy("a"), gate.busy("b")) == (2, 1)
    for i in range(10):                                 # each of a's ends lets exactly the next of a's in, in order
        gate.leave("a")
        await asyncio.sleep(0)
        assert [t.done() for t in burst] == [j <= i for j in range(10)]
    gate.leave("b")
    for _ in range(2):
        gate.leave("a")
    assert (gate.busy("a"), gate.busy("b")) == (0, 0)


async def test_a_weight_multiplies_the_tenants_requests_in_progress():
    gate = TenantGate(2)
    for _ in range(6):
        await asyncio.wait_for(gate.enter("a", 3), 0.1)
    seventh = asyncio.create_task(gate.enter("a", 3))
    await asyncio.sleep(0)
    assert not seventh.done()
    gate.leave("a")
    await asyncio.wait_for(seventh, 0.1)


async def test_a_request_whose_client_left_gives_no_slot_away_and_keeps_none():
    gate = TenantGate(1)
    await gate.enter("a")
    gone = asyncio.create_task(gate.enter("a"))
    stays = asyncio.create_task(gate.enter("a"))
    await asyncio.sleep(0)
    gone.cancel()
    await asyncio.gather(gone, return_exceptions=True)
    gate.leave("a")                    # the slot skips the cancelled turn and goes to the next
    await asyncio.wait_for(stays, 1)
    gate.leave("a")
    assert gate.busy("a") == 0
