"""(STUB: filled in by the policies work.)"""
from __future__ import annotations

ENDPOINTS: list = []
