"""The dashboard in a real headless Chromium against the whole platform: sign in through the form, watch an
allocation appear and turn ACTIVE without a reload, a tenant's pages hold nothing of another tenant, the operator's
fleet map shows the allocated GPUs, every page carries the CSP and logs no console error.

A screenshot of each view goes to .artifacts/screenshots/ (git-ignored); with TESSERA_DOCS_SCREENSHOTS=1 it is
also copied over docs/images/dashboard-*.png (the README's: a plain run leaves the tracked tree as it was)."""
from __future__ import annotations

import asyncio
import os
import shutil
import time
import uuid
from pathlib import Path

import pytest

from tests.support.cleanup import release_everything

playwright = pytest.importorskip("playwright.async_api")

CHROMIUM = "/usr/bin/chromium"
SHOTS = Path(__file__).resolve().parents[2] / ".artifacts" / "screenshots"
DOCS_IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
ON_SCREEN_S = 90.0   # an allocation goes ACTIVE on the simulated nodes within a minute


@pytest.fixture
async def chromium():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: install the system package chromium (system-packages.txt)")
    async with playwright.async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser
        await browser.close()


class Tab:
    """One signed-in browser context, recording console errors and the CSP of every /ui/ document."""

    def __init__(self, page, base: str):
        self.page, self.base, self.errors, self.csp_missing = page, base, [], []
        page.on("console", lambda m: self.errors.append(f"{m.text} {m.location}") if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        page.on("response", self._check_csp)

    def _check_csp(self, resp) -> None:
        if "/ui/" in resp.url and "default-src 'none'" not in (resp.headers.get("content-security-policy") or ""):
            self.csp_missing.append(resp.url)

    @classmethod
    async def sign_in(cls, browser, base: str, api_key: str) -> Tab:
        ctx = await browser.new_context(viewport={"width": 1400, "height": 900})
        tab = cls(await ctx.new_page(), base)
        await tab.page.goto(f"{base}/ui/login")
        await tab.page.fill("#api_key", api_key)
        async with tab.page.expect_navigation() as nav:
            await tab.page.click("button[type=submit]")
        resp = await nav.value
        assert tab.page.url == f"{base}/ui/" and resp.status == 200, (tab.page.url, resp.status, await tab.page.content())
        return tab

    async def open(self, path: str) -> str:
        resp = await self.page.goto(f"{self.base}{path}")
        assert resp.status == 200, (path, resp.status)
        return await self.page.content()

    async def shot(self, name: str) -> None:
        SHOTS.mkdir(parents=True, exist_ok=True)
        path = SHOTS / f"dashboard-{name}.png"
        await self.page.screenshot(path=str(path), full_page=True)
        if os.environ.get("TESSERA_DOCS_SCREENSHOTS") == "1":
            shutil.copyfile(path, DOCS_IMAGES / path.name)


async def new_tenant(admin) -> tuple[dict, dict, dict]:
    t = await admin.create_tenant(f"t-{uuid.uuid4().hex[:8]}")
    await admin.set_quota(t["id"], "shared", "H100", 64)
    return t, await admin.create_user(t["id"], "owner", "tenant_admin"), await admin.create_user(t["id"], "dev")


async def test_the_dashboard_live_scoped_and_strict(platform, admin, chromium):
    from tooling.client import TesseraClient
    base = platform.gateway_url.rstrip("/")
    alice_t, alice_admin, alice_user = await new_tenant(admin)
    bob_t, _, bob_user = await new_tenant(admin)
    async with TesseraClient(base, alice_user["api_key"]) as alice, TesseraClient(base, bob_user["api_key"]) as bob:
        try:
            await _scoped_and_live(platform, chromium, base, alice, bob, alice_admin, alice_t, bob_t)
        finally:   # the package's nodes are shared: the next test gets their GPUs back
            await asyncio.gather(release_everything(alice), release_everything(bob))


async def _scoped_and_live(platform, chromium, base, alice, bob, alice_admin, alice_t, bob_t) -> None:
    theirs = await bob.create_allocation(f"bob-secret-{uuid.uuid4().hex[:4]}", shape="vm.2gpu")
    bob_active = await bob.wait_state(theirs["id"], "ACTIVE", timeout=ON_SCREEN_S)

    tenant = await Tab.sign_in(chromium, base, alice_admin["api_key"])
    posted = time.monotonic()
    mine = await alice.create_allocation("alice-live", shape="vm.2gpu")
    row = tenant.page.locator(f'tr[data-allocation="{mine["id"]}"]')
    await row.wait_for(timeout=15_000)   # it appears without a reload: the page was opened before it existed
    appeared = time.monotonic()
    await row.locator(".state-active").wait_for(timeout=ON_SCREEN_S * 1000)
    active = await alice.allocation(mine["id"])
    print(f"\nalice-live on screen {appeared - posted:.2f} s after its POST, ACTIVE on screen "
          f"{time.monotonic() - appeared:.2f} s later (state {active['state']})")
    await tenant.shot("tenant-overview")

    secrets = [theirs["id"], theirs["name"], bob_t["id"], bob_t["name"], str(bob_active["node_id"]),
               *platform.node_ids]
    for path, name in (("/ui/", None), ("/ui/allocations", "tenant-allocations"),
                       (f"/ui/allocations/{mine['id']}", "tenant-allocation"), ("/ui/resources", None),
                       ("/ui/billing", "tenant-billing"), ("/ui/audit", "tenant-audit")):
        html = await tenant.open(path)
        if path.startswith("/ui/allocations/"):   # the console tail arrives after the page
            await tenant.page.wait_for_function(
                "!document.getElementById('console').textContent.includes('Reading the console')")
            html = await tenant.page.content()
        leaked = [s for s in secrets if s in html]
        assert not leaked, (path, leaked)
        if name:
            await tenant.shot(name)
    assert not tenant.errors and not tenant.csp_missing, (tenant.errors, tenant.csp_missing)

    operator = await Tab.sign_in(chromium, base, platform.admin_key)
    fleet = operator.page.locator("table.fleet .cells .cell")
    await fleet.first.wait_for()
    tenant_cells = await operator.page.locator("table.fleet .cell[class*=' t']").count()
    assert tenant_cells >= 4, "alice's and bob's two GPUs each are coloured by tenant"
    # the chart is drawn (or says there is nothing to draw) once its data has arrived
    await operator.page.wait_for_function("document.getElementById('chart-scheduling').childNodes.length > 0")
    await operator.shot("operator-fleet")
    await operator.open(f"/ui/nodes/{bob_active['node_id']}")
    await operator.shot("operator-node")
    await operator.open(f"/ui/allocations/{mine['id']}")
    await operator.shot("operator-allocation")
    assert not operator.errors and not operator.csp_missing, (operator.errors, operator.csp_missing)
    await alice.release(mine["id"])
    await bob.release(theirs["id"])
