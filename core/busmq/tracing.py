"""OpenTelemetry trace propagation (``pip install 'busmq[otel]'``, then
``BusSettings(tracing=True)`` or ``BUSMQ_TRACING=1``).

A push records a PRODUCER span ``send <queue>`` and writes the current trace context
into each message's headers as W3C ``traceparent`` / ``tracestate`` (with the
application's own headers; those two names are busmq's while tracing is on). Handling a
message (``consumer.run``, a channel end's handler, a service handler) runs in a
CONSUMER span ``process <queue>`` whose parent is the context its producer wrote, so one
trace follows a message through gateways, the federation outbox (a trace spans a cut
link), channels and request/reply, and into other languages' clients, which read the
same headers. Attributes follow OpenTelemetry's messaging conventions
(``messaging.system`` ``busmq``, ``messaging.destination.name``,
``messaging.operation.type``, ``messaging.message.id``,
``messaging.batch.message_count``).

With tracing off (the default) nothing here is imported or called: a push checks one
attribute. Spans go to whatever tracer provider the application set up; without an SDK,
OpenTelemetry's API records nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from .errors import BusError

if TYPE_CHECKING:
    from opentelemetry.trace import Span

TRACE_HEADERS = ("traceparent", "tracestate")
"""The headers a traced push writes (W3C Trace Context; see ``message.with_headers``)."""
SYSTEM = "busmq"


class Tracing:
    """The bus's tracer, made when ``BusSettings.tracing`` is on."""

    def __init__(self, provider: Any = None) -> None:
        try:
            from opentelemetry import trace
            from opentelemetry.trace.propagation.tracecontext import (
                TraceContextTextMapPropagator,
            )
        except ImportError:  # pragma: no cover - the extra is installed in tests
            raise BusError("tracing needs OpenTelemetry's API: pip install 'busmq[otel]'") from None
        # W3C Trace Context whatever the process's global propagator: the headers are
        # the wire contract every client reads.
        self._propagate = TraceContextTextMapPropagator()
        self._kinds = trace.SpanKind
        self._tracer = trace.get_tracer("busmq", tracer_provider=provider)

    @contextmanager
    def send(self, destination: str, count: int) -> Iterator[tuple[dict[str, str], Span]]:
        """A PRODUCER span around a push of ``count`` messages to ``destination``; yields
        the headers that carry its context, and the span."""
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.destination.name": destination,
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
        }
        if count != 1:
            attributes["messaging.batch.message_count"] = count
        with self._tracer.start_as_current_span(
            f"send {destination}", kind=self._kinds.PRODUCER, attributes=attributes
        ) as span:
            carrier: dict[str, str] = {}
            self._propagate.inject(carrier)
            yield carrier, span

    def current_headers(self) -> dict[str, str]:
        """The current context as headers (empty outside a span): what a service
        request carries, so that its handler's span is a child of the requester's."""
        carrier: dict[str, str] = {}
        self._propagate.inject(carrier)
        return carrier

    @staticmethod
    def sent(span: Span, ids: Sequence[int] | None) -> None:
        """Note the id of a single message once stored (``None``: kept in an outbox)."""
        if ids and len(ids) == 1:
            span.set_attribute("messaging.message.id", str(ids[0]))

    @contextmanager
    def process(
        self, destination: str, headers: Mapping[str, str], message_id: int
    ) -> Iterator[Span]:
        """A CONSUMER span for handling message ``message_id`` of ``destination``, a child
        of the context its producer wrote into its ``headers`` (a root span if none)."""
        parent = self._propagate.extract(headers)
        with self._tracer.start_as_current_span(
            f"process {destination}",
            context=parent,
            kind=self._kinds.CONSUMER,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.destination.name": destination,
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "messaging.message.id": str(message_id),
            },
        ) as span:
            yield span
