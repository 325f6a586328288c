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


async def _release(tenant_admin: TesseraClient, a: dict, timeout: float) -> None:
    """Release ``a`` as listed. A 409 means it moved on since the listing: a REQUESTED one whose saga has started
    is PROVISIONING, which is not released (only ACTIVE is): wait for it to be ACTIVE and release it then; one
    that ended or is releasing needs nothing more."""
    try:
        await tenant_admin.release(a["id"])
        return
    except ApiError as exc:
        if exc.status == 404:   # gone
            return
        if exc.status != 409:
            raise
    a = await tenant_admin.wait_state(a["id"], {"ACTIVE", "RELEASING", *ENDED}, timeout)
    if a["state"] == "ACTIVE":
        await tenant_admin.release(a["id"])


async def release_everything(tenant_admin: TesseraClient, timeout: float = 60.0) -> None:
    """Release (or cancel) every allocation of the tenant that still holds or awaits capacity, and wait until each
    has ended. The package's two nodes are shared: what one test leaves running is capacity the next one lacks."""
    items = (await tenant_admin.allocations(limit=100))["items"]

    async def end(a: dict) -> None:
        if a["state"] == "PROVISIONING":   # only ACTIVE is released; a queued request is cancelled
            a = await tenant_admin.wait_state(a["id"], {"ACTIVE", *ENDED}, timeout)
        if a["state"] not in ENDED | {"RELEASING"}:
            await _release(tenant_admin, a, timeout)
        try:
            await tenant_admin.wait_state(a["id"], ENDED, timeout)
        except TimeoutError as exc:   # what its sagas did says where it stopped
            raise TimeoutError(f"{exc}; listed as {a['state']}; its sagas: {await _steps(tenant_admin, a['id'])}") from None
    await asyncio.gather(*(end(a) for a in items if a["state"] not in ENDED))
