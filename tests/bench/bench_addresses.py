"""`./taskw bench:addresses` — not a test. What finding a slot's address costs as a tenant network fills: the
network service's ``free_address`` (in PostgreSQL, over the network's address index) against the way it was
found before, read in the same run: every address of the network read out and parsed, then the lowest free one
looked for in Python. Each attach runs it under the network's lock, so its cost bounds how fast one network's
slots can be attached.

A /16 network is filled densely from its first slot address (the lowest free address is then past the last:
the whole index is walked, the worst case), ``--sizes`` attachments at a time; at each size both ways are
timed ``--repeat`` times on a durable embedded PostgreSQL, and the ratio (new ÷ old, lower is better) printed.
The last line is one JSON object with every figure."""
from __future__ import annotations

import argparse
import asyncio
import ipaddress
import statistics
import time
import uuid
from pathlib import Path

from services.network.adapters.repository import PgNetworkRepository
from services.network.domain.model import TenantNetwork, free_address, slot_range
from shared.db import create_pool, migrate
from tests.bench.common import provisioned_dsn, report, work_dir
from tooling.embedded import EmbeddedPostgres

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "services" / "network" / "schema"
CIDR = ipaddress.IPv4Network("10.64.0.0/16")


async def read_then_scan(conn, network_id: uuid.UUID) -> ipaddress.IPv4Address | None:
    """Before: every address read out and parsed, the lowest free one found in Python."""
    rows = await conn.fetch("SELECT host(ip_address) AS ip FROM attachments WHERE network_id=$1", network_id)
    return free_address(*slot_range(CIDR), None, [ipaddress.IPv4Address(r["ip"]) for r in rows])


async def timed(fn, repeat: int) -> float:
    """The median of ``repeat`` runs, in milliseconds."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        await fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


async def main(sizes: list[int], repeat: int) -> dict:
    work = work_dir("tessera-bench-addresses-")
    pg = EmbeddedPostgres(work / "pg", durable=True).start()
    try:
        pool = await create_pool(await provisioned_dsn(pg, "network"), "network")
        async with pool.acquire() as conn:
            await migrate(conn, "network", SCHEMA_DIR)
            net = TenantNetwork(uuid.uuid4(), uuid.uuid4(), 4242, CIDR)
            repo = PgNetworkRepository(conn)
            await repo.add_network(net)
            first, last = slot_range(CIDR)
            held, out = 0, {"bench": "addresses", "cidr": str(CIDR), "repeat": repeat, "sizes": {}}
            for size in sorted(sizes):
                ids = [uuid.uuid4() for _ in range(size - held)]
                await conn.execute(
                    "INSERT INTO attachments (id, allocation_id, network_id, ip_address, mac_address, node_id, guid) "
                    "SELECT i, gen_random_uuid(), $1, $2::inet + o, "
                    "('02:00:' || regexp_replace(lpad(to_hex(o), 8, '0'), '(..)(..)(..)(..)', '\\1:\\2:\\3:\\4'))::macaddr, "
                    "gen_random_uuid(), i::text "
                    "FROM (SELECT i, n - 1 + $4 AS o FROM unnest($3::uuid[]) WITH ORDINALITY AS t(i, n)) t",
                    net.id, str(first), ids, held)
                await conn.execute("ANALYZE attachments")
                held = size
                expected = first + size
                assert await repo.free_address(net.id, first, last, None) == expected
                assert await read_then_scan(conn, net.id) == expected
                new = await timed(lambda: repo.free_address(net.id, first, last, None), repeat)
                old = await timed(lambda: read_then_scan(conn, net.id), repeat)
                out["sizes"][size] = {"free_address_ms": round(new, 3), "read_then_scan_ms": round(old, 3),
                                      "ratio": round(new / old, 3)}
        await pool.close()
    finally:
        pg.stop()
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[250, 1000, 4000, 16000, 60000])
    ap.add_argument("--repeat", type=int, default=21)
    args = ap.parse_args()
    report(asyncio.run(main(args.sizes, args.repeat)))
