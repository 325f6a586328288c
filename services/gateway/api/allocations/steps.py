"""GET /v1/allocations/{id}/steps: the allocation's sagas and their steps (filled in by the timeline's change)."""
from __future__ import annotations

ENDPOINTS: list = []
