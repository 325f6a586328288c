"""The gateway's OpenAPI document, as committed at contracts/openapi.json (a test keeps them equal).

Regenerate with ``python -m services.gateway.entrypoints.openapi > contracts/openapi.json``.
"""
from __future__ import annotations

import functools

from ..http import openapi
from .http import ENDPOINTS


@functools.cache
def document() -> dict:
    """The document of the gateway's route table (built once a process; the caller must not change it)."""
    return openapi.document(ENDPOINTS)


def render() -> str:
    return openapi.render(ENDPOINTS)


if __name__ == "__main__":
    print(render(), end="")
