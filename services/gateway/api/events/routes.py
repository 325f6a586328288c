"""GET /v1/events: the caller's tenant's allocation events as one live stream (filled in by the feed's change)."""
from __future__ import annotations

ENDPOINTS: list = []
