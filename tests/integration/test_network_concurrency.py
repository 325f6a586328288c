"""No pool value or address is ever given twice, even under concurrency: 50 real transactions at
once (one connection each) against PostgreSQL, through the service's own handlers."""
from __future__ import annotations

import random
import uuid

from services.network import handlers
from services.network.bootstrap import build
from services.network.contracts import AttachNetwork, CreateNetwork
from services.network.domain.model import NetworkPlan
from services.network.handlers import management
from tests.support.commands import attach_cmd
from tests.support.concurrency import run_handler_concurrently

N = 50


async def test_fifty_concurrent_network_creations_never_share_a_vni_nat_address_vrf_or_pkey(run_service, provision):
    rt = await run_service("network", build)
    plan = NetworkPlan()
    tenants = [uuid.uuid4() for _ in range(N - 10)]
    # 40 tenants' first networks (each also leases a VRF id, a PKey and an L3 VNI), plus 10 second networks
    cmds = [CreateNetwork(network_id=uuid.uuid4(), tenant_id=t, name="a", cidr="10.0.0.0/24") for t in tenants]
    cmds += [CreateNetwork(network_id=uuid.uuid4(), tenant_id=t, name="b", cidr="10.1.0.0/24") for t in tenants[:10]]
    random.shuffle(cmds)
    await run_handler_concurrently(rt, await provision("network"), "network.create_network", cmds,
                                   lambda ctx, cmd: management.create_network(ctx, cmd, plan=plan))
    async with rt.pool.acquire() as conn:
        nets = await conn.fetch("SELECT id, vni, host(nat_address) AS nat FROM tenant_networks WHERE tenant_id = ANY($1::uuid[])",
                                tenants)
        res = await conn.fetch("SELECT vrf_table, pkey, l3_vni FROM tenants WHERE tenant_id = ANY($1::uuid[])", tenants)
        all_vnis = await conn.fetch("SELECT value FROM pool_leases WHERE pool='vni'")
    assert len(nets) == N and len(res) == N - 10
    vnis = [r["vni"] for r in nets] + [r["l3_vni"] for r in res]
    assert len(set(vnis)) == N + N - 10 and set(vnis) <= {r["value"] for r in all_vnis}
    assert len({r["nat"] for r in nets}) == N
    assert len({r["vrf_table"] for r in res}) == len({r["pkey"] for r in res}) == N - 10
    assert None not in {r["vrf_table"] for r in res} | {r["pkey"] for r in res}


async def test_fifty_concurrent_attachments_get_distinct_addresses_macs_and_guids(run_service, provision):
    rt = await run_service("network", build)
    plan = NetworkPlan()
    tenant = uuid.uuid4()
    cmds = [AttachNetwork(**attach_cmd(uuid.uuid4(), tenant)) for _ in range(N)]   # the default network, created once
    await run_handler_concurrently(rt, await provision("network"), "network.attach_network", cmds,
                                   lambda ctx, cmd: handlers.attach_network(ctx, cmd, plan=plan))
    async with rt.pool.acquire() as conn:
        rows = await conn.fetch("SELECT host(a.ip_address) AS ip, a.mac_address, a.guid FROM attachments a "
                                "JOIN tenant_networks n ON n.id = a.network_id WHERE n.tenant_id=$1", tenant)
        networks = await conn.fetchval("SELECT count(*) FROM tenant_networks WHERE tenant_id=$1", tenant)
    assert networks == 1 and len(rows) == N
    assert sorted(r["ip"] for r in rows) == sorted(f"10.0.0.{i}" for i in range(2, N + 2))
    assert len({r["mac_address"] for r in rows}) == len({r["guid"] for r in rows}) == N
