"""What an end-to-end test leaves behind on the shared platform, taken back."""
from __future__ import annotations

import asyncio

from tooling.client import ApiError, TesseraClient

ENDED = {"RELEASED", "FAILED"}


async def release_everything(tenant_admin: TesseraClient, timeout: float = 60.0) -> None:
    """Release (or cancel) every allocation of the tenant that still holds or awaits capacity, and wait until each
    has ended. The package's two nodes are shared: what one test leaves running is capacity the next one lacks."""
    items = (await tenant_admin.allocations(limit=100))["items"]

    async def end(a: dict) -> None:
        if a["state"] == "PROVISIONING":   # only ACTIVE is released; a queued request is cancelled
            a = await tenant_admin.wait_state(a["id"], {"ACTIVE", *ENDED}, timeout)
        if a["state"] not in ENDED | {"RELEASING"}:
            try:
                await tenant_admin.release(a["id"])
            except ApiError as exc:
                if exc.status not in (404, 409):   # gone, or already on its way out
                    raise
        await tenant_admin.wait_state(a["id"], ENDED, timeout)
    await asyncio.gather(*(end(a) for a in items if a["state"] not in ENDED))
