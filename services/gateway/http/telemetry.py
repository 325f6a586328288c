"""Per-request server span, access log (structlog JSON, with the trace id) and HTTP metrics.

The handler runs inside the span, so the outbox (which injects the current trace
context into each envelope) carries the request's trace into the saga.
"""
from __future__ import annotations

import asyncio
import time

import structlog
from aiohttp import web
from opentelemetry import trace
from prometheus_client import Counter, Histogram

from shared.observability import extract_trace, tracer

from .auth import PRINCIPAL

log = structlog.get_logger()

REQUESTS = Counter("tessera_http_requests_total", "HTTP requests answered", ["service", "method", "route", "status"])
LATENCY = Histogram("tessera_http_request_seconds", "HTTP request time", ["service", "method", "route"])


def route_of(request: web.Request) -> str:
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "unmatched"


def telemetry_middleware(service: str):
    @web.middleware
    async def observe(request: web.Request, handler) -> web.StreamResponse:
        route, started, status = route_of(request), time.perf_counter(), 500
        with tracer().start_as_current_span(f"{request.method} {route}", context=extract_trace(request.headers),
                                            kind=trace.SpanKind.SERVER) as span:
            span.set_attribute("http.request.method", request.method)
            span.set_attribute("http.route", route)
            span.set_attribute("url.path", request.path)
            try:
                resp = await handler(request)
                status = resp.status
                return resp
            except web.HTTPException as exc:
                status = exc.status
                raise
            except asyncio.CancelledError:
                status = 499  # the client went away (or the server is stopping) mid-request
                raise
            finally:
                elapsed = time.perf_counter() - started
                span.set_attribute("http.response.status_code", status)
                REQUESTS.labels(service, request.method, route, str(status)).inc()
                LATENCY.labels(service, request.method, route).observe(elapsed)
                principal = request.get(PRINCIPAL)
                log.info("http.access", method=request.method, path=request.path, route=route, status=status,
                         duration_ms=round(elapsed * 1000, 2), remote=request.remote,
                         user_id=str(principal.user_id) if principal else None)

    return observe
