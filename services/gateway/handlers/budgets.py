"""(STUB: filled in by the budgets work.)"""
from __future__ import annotations

ENDPOINTS: list = []
