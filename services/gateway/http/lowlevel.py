"""Problem documents for what aiohttp answers by itself.

aiohttp answers a request it cannot parse (a request line or a header field over its 8190-byte limit, too many
headers, a malformed request line, header or Content-Length, a bad chunked body framing) with a ``400 text/plain``
of its own. It does so in ``RequestHandler.handle_error``, before any route or middleware runs: there is no
routed request to run them on, so ``problems_middleware`` never sees these. The same method renders the
last-resort 500 (an exception past every middleware) and the 504 of a handler timeout.

``answer_parser_errors_with_problems(app)`` makes the server aiohttp builds for ``app`` (when the runner is set up)
use a request handler whose ``handle_error`` answers with a problem document instead. aiohttp offers no public
hook for this: the app's ``_make_handler`` (what ``AppRunner`` calls to build the server) is wrapped, and the
server's protocol factory (``Server.__call__``) builds the subclass.
"""
from __future__ import annotations

from typing import Any

import structlog
from aiohttp import web, web_protocol
from aiohttp.http_exceptions import (
    BadHttpMethod,
    BadStatusLine,
    ContentLengthError,
    InvalidHeader,
    InvalidURLError,
    LineTooLong,
    TransferEncodingError,
)

from .problems import ProblemError, problem_response

log = structlog.get_logger()

_MARK = "_tessera_problems"


def low_level_problem(status: int, exc: BaseException | None) -> ProblemError:
    """The problem for an error aiohttp met outside any handler. The detail is ours: aiohttp's messages quote the
    raw bytes it could not parse."""
    if status >= 500:
        detail = ("the request took too long" if status == 504
                  else "the request could not be completed; it has been logged")
        return ProblemError(status, detail)
    if isinstance(exc, LineTooLong):
        limit = exc.args[1] if len(exc.args) > 1 else "its"
        detail = f"the request line or a header field is longer than {limit} bytes"
    elif isinstance(exc, BadHttpMethod):
        detail = "the request method is not a valid HTTP method"
    elif isinstance(exc, InvalidURLError):
        detail = "the request target is not a valid URL"
    elif isinstance(exc, BadStatusLine):
        detail = "the request line is not valid HTTP/1.1"
    elif isinstance(exc, InvalidHeader):
        detail = "a header field is not valid HTTP/1.1"
    elif isinstance(exc, (ContentLengthError, TransferEncodingError)):
        detail = "the body does not match its Content-Length or chunked framing"
    else:
        detail = "the request is not valid HTTP/1.1"
    return ProblemError(status, detail, slug="malformed-request")


class _ProblemRequestHandler(web_protocol.RequestHandler):
    __slots__ = ()

    def handle_error(self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        """As aiohttp's (nothing is sent when a response has started; the connection is closed after it), but the
        answer is a problem document."""
        if request.writer.output_size > 0:
            raise ConnectionError("Response is sent already, cannot send another response with the error message")
        if status >= 500:
            log.error("http.unhandled_error", status=status, error=repr(exc))
        else:
            log.info("http.unparsable_request", status=status, error=type(exc).__name__, remote=request.remote)
        resp = problem_response(low_level_problem(status, exc))
        resp.force_close()
        return resp


class _ProblemServer(web.Server):
    def __call__(self) -> web_protocol.RequestHandler:
        return _ProblemRequestHandler(self, loop=self._loop, **self._kwargs)


def answer_parser_errors_with_problems(app: web.Application) -> None:
    """From the next runner set-up on, ``app``'s server answers unparsable requests with problem documents
    (idempotent)."""
    make_handler = app._make_handler
    if getattr(make_handler, _MARK, False):
        return

    def _make_handler(**kwargs: Any) -> web.Server:
        server = make_handler(**kwargs)
        return _ProblemServer(server.request_handler, request_factory=server.request_factory,
                              handler_cancellation=server.handler_cancellation, loop=server._loop, **server._kwargs)

    setattr(_make_handler, _MARK, True)
    app._make_handler = _make_handler
