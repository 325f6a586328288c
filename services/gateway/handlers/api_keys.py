"""(STUB: filled in by the api_keys work.)"""
from __future__ import annotations

ENDPOINTS: list = []
