"""`./taskw bench:dashboard` — not a test. How long an allocation event takes from publication to the dashboard's
screen, against a plain SSE client of the same events in the same run.

A platform (sim nodes) and one tenant; headless Chromium (Debian's /usr/bin/chromium) signed in twice through the
form: the provider admin on the overview `/ui/` (its live events list) and the tenant admin on `/ui/allocations`
(the allocation rows). The tenant then creates ``--events`` allocations paced one every ``--interval`` s, then a
burst of ``--burst`` at once. Each allocation event is timed:

* publication: the envelope's own ``occurred_at`` (set by the service that published it); ``recorded_at`` (the
  gateway's projection wrote it, the feed's source) is reported beside it as the projection's share;
* on screen: ``Date.now()`` in a MutationObserver installed before any page script, when an element naming the
  event is added: on the overview its ``li[data-seq]`` in the live events list (an event pushed out of the list's
  newest 25 before a repaint is never on screen: counted as ``missed``); on the allocations page the row's
  ``tr[data-updated]`` equal to the event's ``recorded_at`` (the projection updates the row in the event's own
  transaction, so only the events that change a row are on that page), and the row's first appearance for the
  allocation's first event (not timed when a repaint for another event showed the POST's row before it);
* baseline: the arrival of the same event on a plain SSE client of ``GET /v1/events`` in this process.

Every clock is this machine's wall clock. Fragment fetches during the burst (Playwright's request events) show
the 200 ms coalescing: a few per page, not one per event. Target: p95 ≤ 1,000 ms on both pages. The last line of
output is one JSON object."""
from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import math
import os
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path

import aiohttp
import asyncpg

from tests.bench.common import log_problems, pct, report, work_dir
from tooling.client import TesseraClient
from tooling.platform import Platform

CHROMIUM = "/usr/bin/chromium"
TARGET_MS = 1000.0
GPUS_PER_NODE = 8   # as the e2e platform's nodes
SETTLE_S = 60.0   # the longest an allocation may take to turn ACTIVE on sim nodes before the bench gives up

# Installed before any page script: the first time each event's element is added to the DOM, and when.
OBSERVER_JS = """
(() => {
  const seen = {};
  window.__benchSeen = seen;
  const note = (key, t) => { if (!(key in seen)) { seen[key] = t; } };
  const scan = (node, t) => {
    if (node.nodeType !== 1) { return; }
    const found = Array.from(node.querySelectorAll('li[data-seq], tr[data-allocation]'));
    if (node.matches('li[data-seq], tr[data-allocation]')) { found.push(node); }
    for (const el of found) {
      if (el.dataset.seq) { note('seq:' + el.dataset.seq, t); continue; }
      note('row:' + el.dataset.allocation, t);
      if (el.dataset.updated) { note('upd:' + el.dataset.allocation + ':' + el.dataset.updated, t); }
    }
  };
  new MutationObserver((mutations) => {
    const t = Date.now();
    for (const m of mutations) { m.addedNodes.forEach((n) => scan(n, t)); }
  }).observe(document, {childList: true, subtree: true});
})();
"""


class Feed:
    """The baseline: a plain SSE client of GET /v1/events (the provider admin's, narrowed to one tenant), noting
    when each event arrived."""

    def __init__(self, base: str, token: str, tenant_id: str):
        self.url = f"{base}/v1/events?tenant_id={tenant_id}"
        self.token = token
        self.arrived: dict[int, float] = {}   # seq -> wall time of arrival
        self.types: dict[int, tuple[str, str]] = {}   # seq -> (allocation id, type)
        self.queued: collections.Counter = collections.Counter()
        self.connected = asyncio.Event()
        self.task: asyncio.Task | None = None

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        async with aiohttp.ClientSession(timeout=timeout) as s, \
                s.get(self.url, headers={"Authorization": f"Bearer {self.token}"}) as r:
            r.raise_for_status()
            self.connected.set()
            data = None
            async for raw in r.content:
                line = raw.decode().rstrip("\n")
                if line.startswith("data: "):
                    data = line[6:]
                elif not line and data:
                    now = time.time()
                    d = json.loads(data)
                    self.arrived.setdefault(d["seq"], now)
                    self.types[d["seq"]] = (d["allocation_id"], d["type"])
                    if d["type"] == "scheduler.reservation_queued":   # why (reported with the run)
                        self.queued[d["envelope"]["data"].get("reason", "?")] += 1
                    data = None

    def activated(self, ids: set[str]) -> set[str]:
        return {a for a, t in self.types.values() if t == "allocation.activated" and a in ids}

    def last_types(self, ids: set[str]) -> dict[str, int]:
        """How many of ``ids`` stopped at each event type (the newest each had on the feed)."""
        last = {a: t for _, (a, t) in sorted(self.types.items()) if a in ids}
        return dict(collections.Counter(last.values()))

    async def wait_active(self, ids: set[str], deadline_s: float) -> None:
        """Until every allocation of ``ids`` is ACTIVE on the feed (or the deadline)."""
        end = time.monotonic() + deadline_s
        while self.activated(ids) != ids and time.monotonic() < end:
            await asyncio.sleep(0.05)


class Tab:
    """One signed-in page with the observer; the fragment fetches it made, with their wall times."""

    def __init__(self, page):
        self.page, self.fetches = page, []
        page.on("request", lambda r: self.fetches.append(time.time()) if "/ui/fragments/" in r.url else None)

    @classmethod
    async def open(cls, browser, base: str, api_key: str, path: str) -> Tab:
        ctx = await browser.new_context(viewport={"width": 1400, "height": 900})
        await ctx.add_init_script(OBSERVER_JS)
        tab = cls(await ctx.new_page())
        await tab.page.goto(f"{base}/ui/login")
        await tab.page.fill("#api_key", api_key)
        async with tab.page.expect_navigation():
            await tab.page.click("button[type=submit]")
        if path != "/ui/":
            await tab.page.goto(f"{base}{path}")
        return tab

    async def refreshed_after(self, t: float, deadline_s: float = 10.0) -> None:
        """Until the page's script has repainted after wall time ``t`` (it stamps body[data-refreshed])."""
        with contextlib.suppress(Exception):
            await self.page.wait_for_function(
                f"Number(document.body.getAttribute('data-refreshed') || 0) > {t * 1000:.0f}",
                timeout=deadline_s * 1000)

    async def seen(self) -> dict[str, float]:
        return {k: v / 1000 for k, v in (await self.page.evaluate("window.__benchSeen || {}")).items()}

    def fetches_between(self, t0: float, t1: float) -> int:
        return sum(1 for t in self.fetches if t0 <= t <= t1)


async def workload(tenant: TesseraClient, feed: Feed, tabs: list[Tab], n: int, interval: float,
                   burst: int) -> dict:
    """The paced allocations, then the burst; returns the ids and the burst's window and fragment fetches."""
    ids: set[str] = set()
    t0 = time.monotonic()
    for i in range(n):
        await asyncio.sleep(max(0.0, t0 + i * interval - time.monotonic()))   # open loop: the schedule holds
        ids.add((await tenant.create_allocation(f"paced-{i}"))["id"])
    await feed.wait_active(ids, SETTLE_S)
    quiet = max(feed.arrived.values(), default=time.time())
    for tab in tabs:
        await tab.refreshed_after(quiet)
    burst_start = time.time()
    made = await asyncio.gather(*(tenant.create_allocation(f"burst-{i}") for i in range(burst)))
    burst_ids = {a["id"] for a in made}
    await feed.wait_active(burst_ids, SETTLE_S)
    last = max(feed.arrived.values())
    for tab in tabs:
        await tab.refreshed_after(last)
    burst_end = time.time()
    burst_events = sum(1 for s, t in feed.arrived.items() if burst_start <= t <= burst_end)
    return {"ids": ids | burst_ids, "burst_ids": burst_ids, "burst_events": burst_events,
            "burst_window_s": round(burst_end - burst_start, 2),
            "burst_fetches": [tab.fetches_between(burst_start, burst_end) for tab in tabs],
            "not_active_on_feed": feed.last_types((ids | burst_ids) - feed.activated(ids | burst_ids))}


async def events_of(dsn: str, tenant_id: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetch(
            "SELECT e.seq, e.allocation_id::text AS allocation_id, e.type, e.recorded_at, "
            "e.envelope->>'occurred_at' AS occurred_at FROM gateway.allocation_events e "
            "JOIN gateway.allocations_view a ON a.id = e.allocation_id WHERE a.tenant_id = $1 ORDER BY e.seq",
            uuid.UUID(tenant_id))
    finally:
        await conn.close()


def stats(prefix: str, values: list[float]) -> dict:
    out = {f"{prefix}_n": len(values)}
    for q, p in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
        out[f"{prefix}_{q}_ms"] = round(pct(values, p) * 1000, 1) if values else None
    return out


def latencies(events: list[asyncpg.Record], feed: Feed, operator: dict, tenant: dict,
              burst_ids: set[str]) -> dict:
    """Publication → on screen per page, → arrival for the baseline; each from ``occurred_at``."""
    series: dict[str, list[float]] = {k: [] for k in ("baseline", "operator", "tenant", "operator_burst",
                                                      "tenant_burst", "projection", "operator_after_feed",
                                                      "tenant_after_feed")}
    missed, first_seen = 0, set()
    early = 0
    for e in events:
        published = datetime.fromisoformat(e["occurred_at"]).timestamp()
        series["projection"].append(e["recorded_at"].timestamp() - published)
        arrived = feed.arrived.get(e["seq"])
        if arrived is not None:
            series["baseline"].append(arrived - published)
        burst = e["allocation_id"] in burst_ids
        shown = operator.get(f"seq:{e['seq']}")
        if shown is None:
            missed += 1
        else:
            series["operator"].append(shown - published)
            if burst:
                series["operator_burst"].append(shown - published)
            if arrived is not None:
                series["operator_after_feed"].append(shown - arrived)
        row = tenant.get(f"upd:{e['allocation_id']}:{e['recorded_at'].timestamp()}")
        if row is None and e["allocation_id"] not in first_seen:   # the allocation's first event: its row
            row = tenant.get(f"row:{e['allocation_id']}")
            if row is not None and row < published:   # shown before it was published (the POST wrote the row
                early, row = early + 1, None          # and another event's repaint showed it): not timed
        first_seen.add(e["allocation_id"])
        if row is not None:
            series["tenant"].append(row - published)
            if burst:
                series["tenant_burst"].append(row - published)
            if arrived is not None:
                series["tenant_after_feed"].append(row - arrived)
    lost = collections.Counter(e["type"] for e in events if e["seq"] not in feed.arrived)
    out: dict = {"events": len(events), "baseline_never_arrived": dict(lost), "operator_missed": missed,
                 "tenant_row_before_first_event": early}
    for name, values in series.items():
        out.update(stats(name, values))
    return out


def verdict(r: dict) -> dict:
    out = {}
    for page in ("operator", "tenant"):
        if r.get(f"{page}_p95_ms") and r.get("baseline_p95_ms"):
            out[f"{page}_p95_over_baseline_p95"] = round(r[f"{page}_p95_ms"] / r["baseline_p95_ms"], 2)
    out["target_p95_ms"] = TARGET_MS
    out["target_met"] = all((r.get(f"{p}_p95_ms") or math.inf) <= TARGET_MS for p in ("operator", "tenant"))
    return out


async def bench(n: int, interval: float, burst: int) -> dict:
    from playwright.async_api import async_playwright
    work = work_dir("tessera-bench-dashboard-")
    print(f"work dir (service logs: logs/): {work}", file=sys.stderr)
    platform = Platform(work, env={"TESSERA_LOG_LEVEL": "WARNING"}, durable=False)
    await platform.start()
    try:
        for i in range(math.ceil((n + burst) / GPUS_PER_NODE)):
            await platform.add_node(f"bench-ui-{i}", "H100", GPUS_PER_NODE)
        base = platform.gateway_url.rstrip("/")
        async with platform.admin() as admin:
            t = await admin.create_tenant("bench-ui")
            await admin.set_quota(t["id"], "shared", "H100", n + burst)
            owner = (await admin.create_user(t["id"], "owner", "tenant_admin"))["api_key"]
            feed = Feed(base, await admin.token(), t["id"])
        feed.task = asyncio.create_task(feed.run())
        await asyncio.wait_for(feed.connected.wait(), 30)
        async with async_playwright() as p, TesseraClient(base, owner) as tenant:
            browser = await p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            operator_tab = await Tab.open(browser, base, platform.admin_key, "/ui/")
            tenant_tab = await Tab.open(browser, base, owner, "/ui/allocations")
            run = await workload(tenant, feed, [operator_tab, tenant_tab], n, interval, burst)
            seen_op, seen_tenant = await operator_tab.seen(), await tenant_tab.seen()
            await browser.close()
        feed.task.cancel()
        events = await events_of(platform.database_url, t["id"])
        r = latencies(events, feed, seen_op, seen_tenant, run["burst_ids"])
        r.update(verdict(r))
        active = {e["allocation_id"] for e in events if e["type"] == "allocation.activated"}
        r.update(allocations=len(run["ids"]), not_active=len(run["ids"] - active),
                 not_active_on_feed=run["not_active_on_feed"], burst=burst,
                 burst_events=run["burst_events"], burst_window_s=run["burst_window_s"],
                 queued_reasons=dict(feed.queued),
                 burst_fragment_fetches_operator=run["burst_fetches"][0],
                 burst_fragment_fetches_tenant=run["burst_fetches"][1],
                 service_log_problems=log_problems(list((work / "logs").glob("*.log"))))
        return r
    finally:
        await platform.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=40, help="paced allocations (each several events)")
    ap.add_argument("--interval", type=float, default=0.4, help="seconds between the paced allocations")
    ap.add_argument("--burst", type=int, default=10, help="allocations created at once after the paced ones")
    args = ap.parse_args()
    if not Path(CHROMIUM).exists():
        sys.exit(f"{CHROMIUM} is missing: install the system package chromium (system-packages.txt)")
    t0 = time.perf_counter()
    result = asyncio.run(bench(args.events, args.interval, args.burst))
    result["load_average_1m"] = round(os.getloadavg()[0], 2)
    result["bench_wall_s"] = round(time.perf_counter() - t0, 1)
    report(result)


if __name__ == "__main__":
    main()
