"""NATS subject filters: validation and intersection with a stream's subjects (pure)."""
from __future__ import annotations

import re

_TOKEN = re.compile(r"^[A-Za-z0-9_$-]+$|^\*$|^>$")


def valid_filter(subject: str) -> bool:
    """A filter is dot-separated tokens of [A-Za-z0-9_$-], ``*``, or a final ``>``."""
    tokens = subject.split(".")
    if not subject or len(subject) > 255:
        return False
    if any(not _TOKEN.match(t) for t in tokens):
        return False
    return ">" not in tokens[:-1]


def intersect(a: str, b: str) -> str | None:
    """The filter matching exactly the subjects both ``a`` and ``b`` match, or None when disjoint.

    ``intersect("*.evt.>", "allocation.>") == "allocation.evt.>"``.
    """
    ta, tb = a.split("."), b.split(".")
    out: list[str] = []
    for i in range(max(len(ta), len(tb))):
        x = ta[i] if i < len(ta) else None
        y = tb[i] if i < len(tb) else None
        if x == ">":
            return ".".join(out + tb[i:]) if y is not None else None
        if y == ">":
            return ".".join(out + ta[i:]) if x is not None else None
        if x is None or y is None:
            return None
        if x == "*":
            out.append(y)
        elif y == "*" or x == y:
            out.append(x)
        else:
            return None
    return ".".join(out)
