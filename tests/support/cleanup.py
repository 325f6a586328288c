"""What an end-to-end test leaves behind on the shared platform, taken back."""
from __future__ import annotations

import asyncio

from tooling.client import ApiError, TesseraClient

ENDED = {"RELEASED", "FAILED"}


async def _steps(tenant_admin: TesseraClient, allocation_id: str) -> object:
    try:
        return (await tenant_admin.request("GET", f"/v1/allocations/{allocation_id}/steps"))[1]
    except Exception as exc:   # a diagnosis only: never hide the timeout behind it
        return f"unreadable ({exc})"


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
        try:
            await tenant_admin.wait_state(a["id"], ENDED, timeout)
        except TimeoutError as exc:   # what its sagas did says where it stopped
            raise TimeoutError(f"{exc}; listed as {a['state']}; its sagas: {await _steps(tenant_admin, a['id'])}") from None
    await asyncio.gather(*(end(a) for a in items if a["state"] not in ENDED))
