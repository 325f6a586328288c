"""HTTP models of the operator views: dead letters."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import Field

from ...http.schema_base import Out


class DeadLetter(Out):
    """A dead-lettered message."""

    seq: int
    subject: str
    time: datetime | None
    headers: dict[str, str] = Field(description="The Tessera-DLQ-* headers: reason, error, consumer, origin stream and sequence.")
    body: Any = Field(description="The dead-lettered message: its envelope when it is JSON, else its text.")


class DeadLetterList(Out):
    """The newest dead letters, newest first."""

    items: list[DeadLetter]
