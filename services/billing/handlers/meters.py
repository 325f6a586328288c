"""Running meters cut into usage records while they run (STUB: filled in by the metering work)."""
from __future__ import annotations

from shared.runtime import Runtime


async def cut_forever(rt: Runtime, every_s: float) -> None:
    """Record the usage of every running meter up to now, every ``every_s`` seconds (until cancelled)."""
    return None
