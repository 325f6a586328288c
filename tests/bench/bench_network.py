"""`./taskw bench:network` — not a test. One lab node namespace (the real kernel dataplane, root
required), N slots spread over T tenants (default 100 over 20, each tenant with two networks):
attach latency per slot (p50, p99) and attachments/s, then the cost of one full reconcile at that
size, with nothing to repair and after breaking a few objects by hand, then detach latency per slot.
Baseline in the same run: a bare veth pair create+delete through pyroute2 and through `ip link`,
and a bare `nft -f` of a one-rule table; the ratios say how many bare kernel operations a slot costs.
The last line is one JSON object with every figure."""
from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import time
import uuid

from pyroute2 import IPRoute

from services.network.contracts import NetworkSnapshot, SecurityRule, SlotAttachment, TenantNetworks
from services.node_agent.adapters.dataplane import probe
from services.node_agent.adapters.dataplane.lab import Lab, is_root
from services.node_agent.domain.dataplane.names import slot_port_name, vxlan_name
from tests.bench.common import report


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))] if s else float("nan")


def tenants(count: int) -> list[TenantNetworks]:
    out = []
    for t in range(count):
        web = NetworkSnapshot(network_id=uuid.uuid4(), name="web", vni=1000 + 2 * t, cidr="10.0.1.0/24",
                              gateway_ip="10.0.1.1", vrf_table=t + 1)
        rule = SecurityRule(id=uuid.uuid4(), direction="ingress", protocol="tcp", port_from=5432,
                            remote_network_id=web.network_id)
        db = NetworkSnapshot(network_id=uuid.uuid4(), name="db", vni=1001 + 2 * t, cidr="10.0.2.0/24",
                             gateway_ip="10.0.2.1", vrf_table=t + 1, rules=[rule])
        out.append(TenantNetworks(tenant_id=uuid.uuid4(), version=1, networks=[web, db]))
    return out


def slots(tenant_list: list[TenantNetworks], n: int) -> list[tuple[TenantNetworks, SlotAttachment]]:
    out = []
    for i in range(n):
        tenant = tenant_list[i % len(tenant_list)]
        net = tenant.networks[i % 2]
        host = 10 + i // len(tenant_list)
        out.append((tenant, SlotAttachment(attachment_id=uuid.uuid4(), allocation_id=uuid.uuid4(),
                                           network_id=net.network_id, ip_address=f"{net.cidr[:-4]}{host}",
                                           prefix_len=24, mac_address="02:" + ":".join(f"{b:02x}" for b in random.randbytes(5)))))
    return out


def timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def baseline(node_ns: str, rounds: int) -> dict:
    """Bare kernel operations in the same node namespace: the floor a slot's plumbing is built from."""
    def pyroute2_veth(ipr: IPRoute):
        ipr.link("add", ifname="bvA", kind="veth", peer={"ifname": "bvB"})
        ipr.link("del", ifname="bvA")
    with IPRoute(netns=node_ns) as ipr:
        pr = [timed(pyroute2_veth, ipr) for _ in range(rounds)]
    ip = [timed(lambda: (probe.run(node_ns, "ip", "link", "add", "bvA", "type", "veth", "peer", "name", "bvB"),
                         probe.run(node_ns, "ip", "link", "del", "bvA"))) for _ in range(rounds)]
    table = ("table inet bench\ndelete table inet bench\n"
             "table inet bench { chain c { type filter hook forward priority 0; policy accept; }; }\n")
    nft = [timed(lambda: subprocess.run(["ip", "netns", "exec", node_ns, "nft", "-f", "-"], input=table, text=True, check=True))
           for _ in range(rounds)]
    probe.run(node_ns, "nft", "delete", "table", "inet", "bench")
    return {"pyroute2_veth_create_delete_ms": statistics.median(pr) * 1000,
            "ip_link_veth_create_delete_ms": statistics.median(ip) * 1000, "nft_apply_ms": statistics.median(nft) * 1000}


def main(n: int, tenant_count: int, breaks: int) -> dict:
    lab = Lab(1).build()
    try:
        dp, node_ns = lab.dataplanes[0], lab.node_ns[0]
        work = slots(tenants(tenant_count), n)
        start = time.perf_counter()
        attach = [timed(dp.attach, tenant, att) for tenant, att in work]
        attach_wall = time.perf_counter() - start
        noop = timed(dp.reconcile)
        assert dp.reconcile() == [], "a reconcile right after attach must find nothing to repair"
        for _tenant, att in random.sample(work, breaks):   # break some: a slot port and a VXLAN device each
            probe.run(node_ns, "ip", "link", "del", slot_port_name(att.attachment_id))
        for tenant in random.sample(sorted({t.tenant_id: t for t, _ in work}.values(), key=lambda t: str(t.tenant_id)), breaks):
            probe.run(node_ns, "ip", "link", "del", vxlan_name(tenant.networks[0].vni))
        start = time.perf_counter()
        repairs = dp.reconcile()
        repair_s = time.perf_counter() - start
        objects = len(dp.desired().objects())
        detach = [timed(dp.detach, att.allocation_id) for _, att in work]
        leftover = dp.observe()
        base = baseline(node_ns, 20)
    finally:
        lab.destroy()
    p50 = pct(attach, 0.5) * 1000
    return {
        "slots": n, "tenants": tenant_count, "owned_objects_at_size": objects,
        "attach_p50_ms": round(p50, 2), "attach_p99_ms": round(pct(attach, 0.99) * 1000, 2),
        "attachments_per_s": round(n / attach_wall, 1),
        "detach_p50_ms": round(pct(detach, 0.5) * 1000, 2), "detach_p99_ms": round(pct(detach, 0.99) * 1000, 2),
        "reconcile_noop_ms": round(noop * 1000, 1),
        "reconcile_with_repairs_ms": round(repair_s * 1000, 1), "repairs": len(repairs),
        "leftover_after_detach": len(leftover),
        **{k: round(v, 2) for k, v in base.items()},
        "attach_p50_over_pyroute2_veth": round(p50 / base["pyroute2_veth_create_delete_ms"], 1),
        "attach_p50_over_nft_apply": round(p50 / base["nft_apply_ms"], 1),
        "reconcile_noop_over_pyroute2_veth": round(noop * 1000 / base["pyroute2_veth_create_delete_ms"], 1),
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=100, help="slots (attachments) on the node")
    ap.add_argument("-t", "--tenants", type=int, default=20)
    ap.add_argument("--breaks", type=int, default=3, help="slot ports and VXLAN devices deleted before the repair run")
    args = ap.parse_args()
    if not is_root():
        sys.exit("bench_network: needs root (network namespaces, veth, nftables)")
    result = main(args.n, args.tenants, args.breaks)
    report(result)
