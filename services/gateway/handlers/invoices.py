"""(STUB: filled in by the invoices work.)"""
from __future__ import annotations

ENDPOINTS: list = []
