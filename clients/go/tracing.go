package busmq

// OpenTelemetry propagation (Options.Tracer): the W3C trace context rides in the
// messages' traceparent/tracestate headers, as the Python and TypeScript clients write
// and read it, so one trace crosses languages, gateways and the federation outbox.

import (
	"context"
	"fmt"
	"sort"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

var w3c = propagation.TraceContext{}

// carrier adapts message headers to propagation.TextMapCarrier (Debian's OpenTelemetry
// 1.1 has no MapCarrier).
type carrier map[string]string

func (c carrier) Get(key string) string        { return c[key] }
func (c carrier) Set(key string, value string) { c[key] = value }
func (c carrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for key := range c {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	return keys
}

// send runs store in a PRODUCER span when the client traces, the span's context added
// to each message's headers (a message that carries a context already keeps it).
func (q *Queue) send(ctx context.Context, messages []Message,
	store func(context.Context, []Message) ([]uint64, error)) ([]uint64, error) {
	tracer := q.client.tracer
	if tracer == nil {
		return store(ctx, messages)
	}
	attributes := []attribute.KeyValue{
		attribute.String("messaging.system", "busmq"),
		attribute.String("messaging.destination.name", q.Name),
		attribute.String("messaging.operation.type", "send"),
		attribute.String("messaging.operation.name", "send"),
	}
	if len(messages) != 1 {
		attributes = append(attributes, attribute.Int("messaging.batch.message_count", len(messages)))
	}
	ctx, span := tracer.Start(ctx, "send "+q.Name,
		trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attributes...))
	defer span.End()
	injected := carrier{}
	w3c.Inject(ctx, injected)
	traced := make([]Message, len(messages))
	for i, message := range messages {
		headers := carrier{}
		for key, value := range injected {
			headers[key] = value
		}
		for key, value := range message.Headers {
			headers[key] = value
		}
		message.Headers = headers
		traced[i] = message
	}
	ids, err := store(ctx, traced)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	} else if len(ids) == 1 {
		span.SetAttributes(attribute.String("messaging.message.id", fmt.Sprint(ids[0])))
	}
	return ids, err
}

// knownFlags is headers with the traceparent's flags other than "sampled" cleared, as W3C
// Trace Context asks of a reader that does not know them: Python's SDK sets the level 2
// "random" flag (03), which Debian's OpenTelemetry 1.1 refuses as malformed.
func knownFlags(headers map[string]string) carrier {
	parent := headers["traceparent"]
	if len(parent) != 55 || parent[:3] != "00-" || parent[52] != '-' {
		return carrier(headers)
	}
	flags, err := strconv.ParseUint(parent[53:], 16, 8)
	if err != nil {
		return carrier(headers)
	}
	copied := carrier{}
	for key, value := range headers {
		copied[key] = value
	}
	copied["traceparent"] = fmt.Sprintf("%s%02x", parent[:53], flags&1)
	return copied
}

// Traced runs handle (the handling of this delivery) in a CONSUMER span whose parent is
// the context the message carries, when the client traces; else it just runs handle.
func (d Delivery) Traced(ctx context.Context, handle func(context.Context) error) error {
	queue := d.consumer.queue
	return process(ctx, queue.client.tracer, queue.Name, d.ID, d.Headers, handle)
}

// process runs handle in a CONSUMER span for message id of destination, a child of the
// context headers carry, when tracer is not nil.
func process(ctx context.Context, tracer trace.Tracer, destination string, id uint64,
	headers map[string]string, handle func(context.Context) error) error {
	if tracer == nil {
		return handle(ctx)
	}
	parent := w3c.Extract(ctx, knownFlags(headers))
	ctx, span := tracer.Start(parent, "process "+destination,
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			attribute.String("messaging.system", "busmq"),
			attribute.String("messaging.destination.name", destination),
			attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.operation.name", "process"),
			attribute.String("messaging.message.id", fmt.Sprint(id)),
		))
	defer span.End()
	err := handle(ctx)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	return err
}

// withContext is headers with the current trace context added (a copy; headers win),
// when the client traces.
func withContext(ctx context.Context, tracer trace.Tracer, headers map[string]string) map[string]string {
	if tracer == nil {
		return headers
	}
	merged := carrier{}
	w3c.Inject(ctx, merged)
	for key, value := range headers {
		merged[key] = value
	}
	return merged
}
