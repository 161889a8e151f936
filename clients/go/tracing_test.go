package busmq

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	pb "busmq.dev/go/gen/busmq/v1"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

func tracedClient(t *testing.T, d *deployment) (*Client, *tracetest.SpanRecorder, *sdktrace.TracerProvider) {
	recorder := tracetest.NewSpanRecorder()
	provider := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recorder))
	client, err := Dial(context.Background(), Options{Address: d.address(), Secret: d.secret,
		Timeout: 5 * time.Second, Tracer: provider.Tracer("busmq")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return client, recorder, provider
}

func ended(recorder *tracetest.SpanRecorder, name string) sdktrace.ReadOnlySpan {
	for _, span := range recorder.Ended() {
		if span.Name() == name {
			return span
		}
	}
	return nil
}

// handleOne consumes one message of queue at-least-once, handling it in its span.
func handleOne(t *testing.T, queue *Queue) Delivery {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	consumer := queue.Consume(ctx, ConsumeOptions{Mode: pb.ConsumeMode_CONSUME_MODE_AT_LEAST_ONCE})
	defer consumer.Stop()
	delivery, ok := <-consumer.Deliveries()
	if !ok {
		t.Fatalf("no delivery: %v", consumer.Err())
	}
	if err := delivery.Traced(ctx, func(ctx context.Context) error { return delivery.Ack(ctx) }); err != nil {
		t.Fatal(err)
	}
	return delivery
}

func TestAHandledMessageIsAChildOfItsPush(t *testing.T) {
	d := start(t)
	client, recorder, provider := tracedClient(t, d)
	queue := client.Queue("go-traced")
	ctx := context.Background()
	if _, err := queue.Attach(ctx, 0); err != nil {
		t.Fatal(err)
	}
	ctx, ship := provider.Tracer("app").Start(ctx, "ship")
	message := Text("parcel")
	message.Headers = map[string]string{"tenant": "a"}
	if _, err := queue.Push(ctx, message); err != nil {
		t.Fatal(err)
	}
	ship.End()
	delivery := handleOne(t, queue)
	if delivery.Headers["tenant"] != "a" || !strings.HasPrefix(delivery.Headers["traceparent"], "00-") {
		t.Fatalf("headers %v", delivery.Headers)
	}
	send, process := ended(recorder, "send go-traced"), ended(recorder, "process go-traced")
	if send == nil || process == nil {
		t.Fatalf("spans %v", recorder.Ended())
	}
	if send.Parent().SpanID() != ship.SpanContext().SpanID() {
		t.Fatalf("the push's parent is %v, not the app's span", send.Parent().SpanID())
	}
	if process.Parent().SpanID() != send.SpanContext().SpanID() || process.SpanContext().TraceID() != ship.SpanContext().TraceID() {
		t.Fatalf("the handling span is not a child of the push's in the same trace")
	}
}

// A Python producer (tracing on) pushes; this Go consumer's span is in its trace.
func TestAMessagePushedByPythonIsHandledInItsTrace(t *testing.T) {
	d := start(t)
	client, recorder, _ := tracedClient(t, d)
	queue := client.Queue("py-to-go")
	if _, err := queue.Attach(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	script := `
import asyncio, sys
from busmq import Bus, BusSettings
from opentelemetry.sdk.trace import TracerProvider

async def main():
    provider = TracerProvider()
    settings = BusSettings(redis_urls=(sys.argv[1],), tracing=True)
    async with Bus(settings, tracer_provider=provider) as bus:
        with provider.get_tracer("py").start_as_current_span("py-produce") as span:
            await bus.queue(sys.argv[2]).push("from python")
    print(f"{span.get_span_context().trace_id:032x}")

asyncio.run(main())
`
	python := filepath.Join(repoRoot(), ".venv", "bin", "python")
	out, err := exec.Command(python, "-c", script, fmt.Sprintf("redis://127.0.0.1:%d", d.redisPort), "py-to-go").Output()
	if err != nil {
		t.Fatalf("python producer: %v", err)
	}
	pythonTrace := strings.TrimSpace(string(out))
	delivery := handleOne(t, queue)
	if string(delivery.Payload) != "from python" {
		t.Fatalf("payload %q", delivery.Payload)
	}
	process := ended(recorder, "process py-to-go")
	if process == nil || process.SpanContext().TraceID().String() != pythonTrace {
		t.Fatalf("the Go handling is not in the Python producer's trace %s: headers %v", pythonTrace, delivery.Headers)
	}
	if !process.Parent().IsRemote() {
		t.Fatalf("the handling span's parent is not the remote producer's")
	}
}

// federatedPush runs a traced Python producer in "another datacenter": its bus federates
// queue of this gateway, the link is cut while it pushes (the push waits in its outbox)
// and restored. It returns the producer's trace id and its push's span id.
func federatedPush(t *testing.T, d *deployment, queue string) (traceID, sendSpanID string) {
	python := filepath.Join(repoRoot(), ".venv", "bin", "python")
	command := exec.Command(python, "-m", "tests.support.traced_federated_push", d.address(), d.secret, queue)
	command.Dir = repoRoot()
	out, err := command.Output()
	if err != nil {
		t.Fatalf("python producer: %v", err)
	}
	var result struct {
		TraceID     string            `json:"trace_id"`
		SendSpanIDs map[string]string `json:"send_span_ids"`
		OutboxHeld  int               `json:"outbox_held"`
	}
	if err := json.Unmarshal(out, &result); err != nil {
		t.Fatalf("python producer printed %q: %v", out, err)
	}
	if result.OutboxHeld != 1 {
		t.Fatalf("the push did not wait in the outbox during the cut: %+v", result)
	}
	return result.TraceID, result.SendSpanIDs[queue]
}

// One trace across datacenters and a cut link: Python producer, its outbox, the gateway,
// this Go consumer.
func TestATraceSpansAFederationCutToAGoConsumer(t *testing.T) {
	d := start(t)
	client, recorder, _ := tracedClient(t, d)
	queue := client.Queue("shipments-go")
	if _, err := queue.Attach(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	traceID, sendSpanID := federatedPush(t, d, "shipments-go")
	delivery := handleOne(t, queue)
	if !strings.Contains(string(delivery.Payload), "shipments-go") {
		t.Fatalf("payload %q", delivery.Payload)
	}
	process := ended(recorder, "process shipments-go")
	if process == nil || process.SpanContext().TraceID().String() != traceID {
		t.Fatalf("the Go handling is not in the producer's trace %s: headers %v", traceID, delivery.Headers)
	}
	if process.Parent().SpanID().String() != sendSpanID || !process.Parent().IsRemote() {
		t.Fatalf("the handling span's parent is %v, not the remote push %s", process.Parent().SpanID(), sendSpanID)
	}
}

// A request from Go to a traced Python handler is one trace: the handler's span is a
// child of the requester's; a Go handler's span is a child of a Go requester's.
func TestARequestIsOneTraceAcrossLanguages(t *testing.T) {
	d := start(t)
	client, recorder, provider := tracedClient(t, d)
	python := filepath.Join(repoRoot(), ".venv", "bin", "python")
	handler := exec.Command(python, "-m", "tests.support.service_worker",
		fmt.Sprintf(`["redis://127.0.0.1:%d"]`, d.redisPort), "py-traced", "traced")
	handler.Dir = repoRoot()
	waitFor(t, handler, `"serving"`)
	t.Cleanup(func() { stop(t, handler, syscall.SIGTERM) })
	ctx, quote := provider.Tracer("app").Start(context.Background(), "quote")
	reply, err := client.Service("py-traced").Request(ctx, Message{Payload: []byte(`{"op":"trace"}`),
		Kind: pb.PayloadKind_PAYLOAD_KIND_JSON}, 10*time.Second)
	quote.End()
	if err != nil {
		t.Fatal(err)
	}
	var ids map[string]string
	if err := json.Unmarshal(reply.Payload, &ids); err != nil {
		t.Fatal(err)
	}
	if ids["trace_id"] != quote.SpanContext().TraceID().String() || ids["parent_id"] != quote.SpanContext().SpanID().String() {
		t.Fatalf("the Python handler's span %v is not a child of %v", ids, quote.SpanContext())
	}

	server := client.Service("go-traced").Serve(context.Background(), func(ctx context.Context, request ServedRequest) (Message, error) {
		return Text("ok"), nil
	}, ServeOptions{})
	defer server.Stop()
	ctx, ask := provider.Tracer("app").Start(context.Background(), "ask")
	if _, err := client.Service("go-traced").Request(ctx, Text("?"), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	ask.End()
	server.Stop()
	process := ended(recorder, "process go-traced")
	if process == nil || process.Parent().SpanID() != ask.SpanContext().SpanID() {
		t.Fatalf("the Go handler's span is not a child of the request's: %v", process)
	}
}
