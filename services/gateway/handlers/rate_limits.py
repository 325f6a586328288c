"""(STUB: filled in by the rate_limits work.)"""
from __future__ import annotations

ENDPOINTS: list = []
