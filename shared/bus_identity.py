"""Who a process is on the bus: its NATS identity (an nkey, whose seed file the process holds) and the prefix of
its inboxes.

Each identity's inboxes (request replies, JetStream API answers, pull-consumer deliveries) live under
``_INBOX_<identity>.>``, and its permissions (``tooling.bus_permissions``) let it subscribe there and nowhere
else under an inbox: one identity cannot read another's replies or deliveries.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any


def inbox_prefix(identity: str) -> str:
    return f"_INBOX_{identity}"


def connect_options(identity: str, seed_file: str | Path | None) -> dict[str, Any]:
    """Keyword arguments for ``nats.connect`` as ``identity``, signing with the nkey seed in ``seed_file``
    (None: no credentials, for a server without authorization)."""
    options: dict[str, Any] = {"inbox_prefix": inbox_prefix(identity)}
    if seed_file is not None:
        options["nkeys_seed"] = str(seed_file)
    return options
