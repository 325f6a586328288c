"""``tessera events``: the ops stream ``GET /v1/ops/events`` (server-sent; ``data`` {stream, seq, subject,
type, envelope}). ``--subjects`` goes to the server; ``--tenant``, ``--type`` and ``--allocation`` are
applied here, on the envelope, since the server has no such filters."""
from __future__ import annotations

import fnmatch
import json
import sys

from cli.render import emit


def matches(item: dict, tenant: str | None, types: list[str], allocation: str | None) -> bool:
    env = item.get("envelope") if isinstance(item.get("envelope"), dict) else {}
    if tenant and str(env.get("tenant_id")) != tenant:
        return False
    if types and not any(fnmatch.fnmatchcase(str(item.get("type") or env.get("type")), t) for t in types):
        return False
    if allocation:
        data = env.get("data") if isinstance(env.get("data"), dict) else {}
        if allocation not in (str(env.get("correlation_id")), str(data.get("allocation_id"))):
            return False
    return True


def text(item: dict, output: str) -> str:
    if output == "json":
        return json.dumps(item, separators=(",", ":"), default=str)
    if output == "yaml":
        import yaml
        return "---\n" + yaml.safe_dump(item, sort_keys=False).rstrip()
    env = item.get("envelope") if isinstance(item.get("envelope"), dict) else {}
    if output == "name":
        return str(env.get("id") or item.get("seq"))
    return "\t".join(str(x if x is not None else "-") for x in (
        env.get("occurred_at"), item.get("type"), item.get("subject"), env.get("tenant_id"), env.get("correlation_id")))


def stream(c, follow: bool, tenant: str | None, types: list[str], allocation: str | None, subjects: str | None,
           output: str) -> None:
    """Print matching events until interrupted (without ``follow``: until the stream is quiet for 2 s)."""
    query = {"subjects": subjects} if subjects else None
    feed = c.events("/v1/ops/events", idle_s=2.0, query=query)   # open: what is published from now on comes
    print("watching the streams (Ctrl-C stops)", file=sys.stderr, flush=True)
    for ev in feed:
        if ev is None:
            if not follow:
                return
            continue
        try:
            item = json.loads(ev[2])
        except ValueError:
            continue
        if matches(item, tenant, types, allocation):
            emit(text(item, output))
