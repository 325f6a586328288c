"""Network management commands the service can never apply (sent on the bus directly, bypassing the gateway's
validation), such as a NUL in a network's name: the command is answered ``network.command_rejected`` at once
(acknowledged on its first delivery), and nothing is leased. (The domain refuses that name before PostgreSQL
sees it; data PostgreSQL refuses would be answered the same way, through the subscription's ``on_refused``.)"""
from __future__ import annotations

import uuid

from services.network.bootstrap import build
from shared.settings import BusSettings
from tests.support.bus import caused_by, wait_acked
from tests.support.bus import send_command as send

SLOW_RETRIES = BusSettings(ack_wait_s=5, max_deliver=3, retry_backoff_s=[60.0])   # a retry: a minute later


async def test_a_network_named_with_a_nul_is_rejected_at_once_and_leases_nothing(run_service, nc, watch):
    rt = await run_service("network", build, bus=SLOW_RETRIES)
    js, events = nc.jetstream(), await watch("network.evt.>")
    tenant, network = uuid.uuid4(), uuid.uuid4()
    cmd, seq = await send(js, "network.create_network", {"network_id": network, "tenant_id": tenant,
                                                         "name": "web\x00", "cidr": "10.60.0.0/24"})
    [hit] = await events.wait_for(caused_by(cmd), 15)
    assert hit[1]["type"] == "network.command_rejected" and hit[1]["tenant_id"] == str(tenant)
    data = hit[1]["data"]
    assert (data["command"], data["network_id"], data["rule_id"]) == ("create_network", str(network), None)
    assert data["reason"].startswith("name: 'web\\x00' must be")
    await wait_acked(js, "TESSERA_NETWORK", "network__network_create_network", seq, timeout=15)
    async with rt.pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM tenant_networks WHERE tenant_id=$1", tenant) == 0
