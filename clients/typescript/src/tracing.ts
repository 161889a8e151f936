// OpenTelemetry propagation (the client option `tracing`): a push records a PRODUCER span
// `send <queue>` and writes the current context into each message's headers as W3C
// `traceparent`/`tracestate`; a request carries the requester's context; a service
// handler, and `delivery.traced(fn)`, run in a CONSUMER span `process <name>` whose parent
// is the context the message carries. The same headers the Python and Go sides read and
// write, so one trace crosses languages, gateways and the federation outbox.

import {
  type Attributes,
  context,
  defaultTextMapGetter,
  defaultTextMapSetter,
  ROOT_CONTEXT,
  type Span,
  SpanKind,
  SpanStatusCode,
  trace,
  type Tracer,
  type TracerProvider,
} from "@opentelemetry/api";
import { W3CTraceContextPropagator } from "@opentelemetry/core";

const W3C = new W3CTraceContextPropagator();
const SYSTEM = "busmq";

export interface TracingOptions {
  /** Where the spans go (default: OpenTelemetry's global provider). */
  tracerProvider?: TracerProvider;
}

export class Tracing {
  private readonly tracer: Tracer;

  constructor(options: TracingOptions = {}) {
    this.tracer = (options.tracerProvider ?? trace).getTracer("busmq");
  }

  /** Run `fn` in a PRODUCER span for a push of `count` messages to `destination`; it gets
   * the headers that carry the span's context. */
  send<T>(destination: string, count: number, fn: (carrier: Record<string, string>) => Promise<T>): Promise<T> {
    const attributes: Attributes = {
      "messaging.system": SYSTEM,
      "messaging.destination.name": destination,
      "messaging.operation.type": "send",
      "messaging.operation.name": "send",
    };
    if (count !== 1) {
      attributes["messaging.batch.message_count"] = count;
    }
    return this.tracer.startActiveSpan(
      `send ${destination}`,
      { kind: SpanKind.PRODUCER, attributes },
      (span) => ended(span, () => fn(this.current())),
    );
  }

  /** The current context as headers (empty outside a span). */
  current(): Record<string, string> {
    const carrier: Record<string, string> = {};
    W3C.inject(context.active(), carrier, defaultTextMapSetter);
    return carrier;
  }

  /** Run `fn` in a CONSUMER span for handling message `id` of `destination`, a child of
   * the context in `headers` (a root span if there is none). */
  process<T>(destination: string, headers: Record<string, string>, id: bigint | string, fn: () => Promise<T>): Promise<T> {
    const parent = W3C.extract(ROOT_CONTEXT, headers, defaultTextMapGetter);
    return this.tracer.startActiveSpan(
      `process ${destination}`,
      {
        kind: SpanKind.CONSUMER,
        attributes: {
          "messaging.system": SYSTEM,
          "messaging.destination.name": destination,
          "messaging.operation.type": "process",
          "messaging.operation.name": "process",
          "messaging.message.id": String(id),
        },
      },
      parent,
      (span) => ended(span, fn),
    );
  }
}

async function ended<T>(span: Span, fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (error) {
    span.recordException(error instanceof Error ? error : String(error));
    span.setStatus({ code: SpanStatusCode.ERROR });
    throw error;
  } finally {
    span.end();
  }
}
