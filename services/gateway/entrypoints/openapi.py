"""The gateway's OpenAPI document, as committed at contracts/openapi.json (a test keeps them equal).

Regenerate with ``python -m services.gateway.entrypoints.openapi > contracts/openapi.json``.
"""
from __future__ import annotations

from ..http import openapi
from .http import ENDPOINTS


def document() -> dict:
    """The document of the gateway's route table."""
    return openapi.document(ENDPOINTS)


def render() -> str:
    return openapi.render(ENDPOINTS)


if __name__ == "__main__":
    print(render(), end="")
