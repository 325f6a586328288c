"""A live read from another service over core NATS (``shared.rpc``), its three ways of failing as problems."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import structlog

from shared.rpc import RpcError, RpcNoResponders, RpcTimeout

from .problems import ProblemError

log = structlog.get_logger()


@contextlib.contextmanager
def answered(who: str, slug: str, cannot: str, failed: str, *, timeout_s: float | None = None,
             retry_after_s: int = 5, **context: str) -> Iterator[None]:
    """Run an ``rpc.request`` to ``who`` ("the saga coordinator", "node <id>") inside. Nobody connected (told by the
    server at once) is a 503 ``<slug>-unavailable`` with Retry-After: "<who> does not answer; <cannot>"; no answer
    in time a 504 ``<slug>-timeout``; the owner's own failure a 502 ``<slug>-failed``: "<who> could not <failed>",
    logged with ``context`` (its message stays in the log: it may name the owner's internals)."""
    try:
        yield
    except RpcNoResponders:
        raise ProblemError(503, f"{who} does not answer; {cannot}", slug=f"{slug}-unavailable",
                           headers={"Retry-After": str(retry_after_s)}) from None
    except RpcTimeout:
        within = f"within {timeout_s:g} s" if timeout_s is not None else "in time"
        raise ProblemError(504, f"{who} did not answer {within}; {cannot}", slug=f"{slug}-timeout") from None
    except RpcError as exc:
        log.warning("rpc.owner_failed", who=who, slug=slug, error=str(exc), **context)
        raise ProblemError(502, f"{who} could not {failed}", slug=f"{slug}-failed") from None
