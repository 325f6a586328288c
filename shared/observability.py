"""Logs, traces and metrics, configured once per process in bootstrap.

- structlog JSON logs; every line carries trace_id/span_id of the current span and
  whatever correlation ids the handler bound (allocation, saga, tenant).
- OpenTelemetry spans; W3C trace context travels in NATS headers (traceparent).
  Spans are exported as JSON lines to TESSERA_TRACE_FILE when set (the test suite
  reads them to prove one trace crosses every service hop).
- Prometheus metrics in the default registry, served on /metrics.
"""
from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Sequence

import structlog
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client import Counter, Gauge, Histogram

_propagator = TraceContextTextMapPropagator()

MESSAGES = Counter("tessera_messages_consumed_total", "Messages handled by a consumer", ["service", "type", "outcome"])
HANDLER_SECONDS = Histogram("tessera_handler_seconds", "Handler time per message type", ["service", "type"])
PUBLISHED = Counter("tessera_outbox_published_total", "Outbox rows published to JetStream", ["service"])
DEAD_LETTERS = Counter("tessera_dead_letters_total", "Messages moved to the dead-letter stream", ["service", "reason"])
# a consumer's lag: what the server still holds for the durable, as of its last fetch (0 after a fetch found nothing)
CONSUMER_PENDING = Gauge("tessera_consumer_pending_messages",
                         "Messages waiting for a durable consumer: held by the stream, or fetched and not yet handed "
                         "to a worker", ["service", "consumer"])


def _add_trace_ids(_, __, event_dict):
    span = trace.get_current_span()
    ctx = span.get_span_context()
    if ctx.is_valid:
        event_dict["trace_id"] = format(ctx.trace_id, "032x")
        event_dict["span_id"] = format(ctx.span_id, "016x")
    return event_dict


def configure_logging(service: str, level: str = "INFO") -> None:
    logging.basicConfig(stream=sys.stderr, level=getattr(logging, level.upper(), logging.INFO), format="%(message)s")
    for noisy in ("faststream", "nats", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _add_trace_ids,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper(), logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.bind_contextvars(service=service)


class JsonLinesSpanExporter(SpanExporter):
    """Append finished spans to a file, one JSON object per line (shared by several processes)."""

    def __init__(self, path: str):
        self.path = path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = []
        for s in spans:
            ctx = s.context
            parent = s.parent
            lines.append(json.dumps({
                "service": s.resource.attributes.get("service.name"),
                "name": s.name,
                "trace_id": format(ctx.trace_id, "032x"),
                "span_id": format(ctx.span_id, "016x"),
                "parent_id": format(parent.span_id, "016x") if parent else None,
                "attributes": {k: str(v) for k, v in (s.attributes or {}).items()},
            }))
        with self._lock, open(self.path, "a") as f:
            f.write("\n".join(lines) + "\n")
        return SpanExportResult.SUCCESS


def configure_tracing(service: str, trace_file: str | None) -> TracerProvider:
    """Spans exported to ``trace_file`` when one is set. Without one nothing is recorded (ALWAYS_OFF): spans
    are non-recording, costing no attribute or export work, but they still carry the trace id, so the
    ``traceparent`` a service writes on its messages continues the trace it received."""
    provider = TracerProvider(resource=Resource.create({"service.name": service}),
                              sampler=None if trace_file else ALWAYS_OFF)
    if trace_file:
        provider.add_span_processor(BatchSpanProcessor(JsonLinesSpanExporter(trace_file), schedule_delay_millis=200))
    trace.set_tracer_provider(provider)
    return provider


def tracer():
    return trace.get_tracer("tessera")


def inject_trace() -> dict[str, str]:
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier


def extract_trace(headers: dict[str, str] | None) -> otel_context.Context:
    return _propagator.extract(headers or {})
