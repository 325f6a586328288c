"""RFC 9457 problem details: the one error shape of the API, and the middleware that enforces it.

Every error leaves the gateway as ``application/problem+json`` with ``type``, ``title``,
``status`` and ``detail`` (plus ``errors`` naming each field for validation problems).
Unexpected exceptions become a 500 that reveals nothing of the internals.
"""
from __future__ import annotations

import json

import structlog
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from pydantic import ValidationError

from .schema_base import FieldError, Problem

log = structlog.get_logger()

PROBLEM_JSON = "application/problem+json"
_BASE = "https://tessera.io/problems/"

_TITLES = {
    400: "Bad request", 401: "Unauthorized", 403: "Forbidden", 404: "Not found", 405: "Method not allowed",
    409: "Conflict", 413: "Content too large", 415: "Unsupported media type", 422: "Unprocessable content",
    429: "Too many requests",
    500: "Internal server error", 502: "Bad gateway", 503: "Service unavailable", 504: "Gateway timeout",
}
_SLUGS = {
    400: "bad-request", 401: "unauthorized", 403: "forbidden", 404: "not-found", 405: "method-not-allowed",
    409: "conflict", 413: "content-too-large", 415: "unsupported-media-type", 422: "validation-error",
    429: "rate-limited",
    500: "internal-error", 502: "bad-gateway", 503: "unavailable", 504: "gateway-timeout",
}


class ProblemError(Exception):
    """Raise anywhere in a request to answer with this problem."""

    def __init__(self, status: int, detail: str, *, slug: str | None = None, title: str | None = None,
                 errors: list[FieldError] | None = None, headers: dict[str, str] | None = None):
        super().__init__(detail)
        self.status, self.detail, self.errors, self.headers = status, detail, errors, headers or {}
        self.slug = slug or _SLUGS.get(status, "error")
        self.title = title or _TITLES.get(status, "Error")

    def to_problem(self, instance: str | None = None) -> Problem:
        return Problem(type=_BASE + self.slug, title=self.title, status=self.status, detail=self.detail,
                       instance=instance, errors=self.errors)


def problem_response(exc: ProblemError, instance: str | None = None) -> web.Response:
    problem = exc.to_problem(instance)
    # the optional members are left out when empty; an extension member that is null stays (its schema requires it)
    body = problem.model_dump(mode="json", exclude={k for k in ("instance", "errors") if getattr(problem, k) is None})
    return web.Response(status=exc.status, text=json.dumps(body), content_type=PROBLEM_JSON, headers=exc.headers)


def not_found(what: str = "resource") -> ProblemError:
    return ProblemError(404, f"no such {what}")


def forbidden(detail: str) -> ProblemError:
    return ProblemError(403, detail)


def validation_problem(errors: list[FieldError], detail: str | None = None) -> ProblemError:
    fields = ", ".join(e.field for e in errors)
    return ProblemError(422, detail or f"invalid field(s): {fields}", errors=errors)


def printable(text: str, limit: int = 130) -> str:
    """``text`` as it may be echoed in a problem: control characters and lone surrogates escaped (``\\u0000``),
    at most ``limit`` characters (a client's dict key can be anything it sent)."""
    shown = "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in text[:limit])
    return shown + ("…" if len(text) > limit else "")


def field_errors(exc: ValidationError, prefix: str = "") -> list[FieldError]:
    """Pydantic's errors as {field, message, code}, the field dotted (``labels.team``)."""
    out = []
    for err in exc.errors(include_url=False):
        loc = [printable(str(p)) for p in err["loc"] if p != "[key]"]
        field = ".".join([prefix] + loc if prefix else loc) or "body"
        message = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
        out.append(FieldError(field=field, message=message, code=err["type"]))
    return out


def _from_http_exception(exc: web.HTTPException) -> ProblemError:
    detail = exc.text if exc.text and not exc.text.startswith(f"{exc.status}:") else exc.reason
    headers = {k: v for k, v in exc.headers.items() if k.lower() in ("allow", "www-authenticate", "retry-after")}
    return ProblemError(exc.status, detail, headers=headers)


@web.middleware
async def problems_middleware(request: web.Request, handler) -> web.StreamResponse:
    """Turn every exception into problem+json; a 500 says nothing of the internals."""
    instance = request.rel_url.raw_path   # percent-encoded as sent: a URI reference whatever the path holds
    try:
        return await handler(request)
    except ProblemError as exc:
        return problem_response(exc, instance)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return problem_response(_from_http_exception(exc), instance)
    except HttpProcessingError:   # the body's framing broke while a handler read it (bad chunk, short body)
        return problem_response(ProblemError(400, "the body does not match its Content-Length or chunked framing",
                                             slug="malformed-request"), instance)
    except (ConnectionResetError, ConnectionAbortedError):
        raise  # the client went away: nobody to answer
    except Exception:
        log.exception("http.unhandled_error", method=request.method, path=request.path)
        return problem_response(ProblemError(500, "the request could not be completed; it has been logged"), instance)
