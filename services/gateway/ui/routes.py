"""The dashboard's routes (filled in by the dashboard's change)."""
from __future__ import annotations

from aiohttp import web


def add_ui_routes(app: web.Application) -> None:
    """Mount /ui/ on ``app`` (nothing yet)."""
