package busmq

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	pb "busmq.dev/go/gen/busmq/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"
)

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// pythonOn runs a Python script on the deployment's Redis (its URL is sys.argv[1]).
func pythonOn(d *deployment, script string) *exec.Cmd {
	python := filepath.Join(repoRoot(), ".venv", "bin", "python")
	command := exec.Command(python, "-c", script, fmt.Sprintf("redis://127.0.0.1:%d", d.redisPort))
	command.Dir = repoRoot()
	return command
}

// pythonBus runs body (indented Python) in an async function with a bus on the
// deployment's Redis as bus.
func pythonBus(d *deployment, body string) *exec.Cmd {
	return pythonOn(d, `
import asyncio, json, sys
from busmq import Bus, BusSettings
async def main():
    async with Bus(BusSettings(redis_urls=(sys.argv[1],))) as bus:
`+body+`
asyncio.run(main())
`)
}

func JSON(value interface{}) Message {
	payload, _ := json.Marshal(value)
	return Message{Payload: payload, Kind: pb.PayloadKind_PAYLOAD_KIND_JSON}
}

func next(t *testing.T, deliveries <-chan Delivery) Delivery {
	t.Helper()
	select {
	case delivery, ok := <-deliveries:
		if !ok {
			t.Fatal("the consumer ended")
		}
		return delivery
	case <-time.After(10 * time.Second):
		t.Fatal("no delivery")
	}
	return Delivery{}
}

func TestControlsDeadLettersAndListings(t *testing.T) {
	d := start(t)
	client := dial(t, d, d.secret)
	ctx := context.Background()
	jobs := client.Queue("go-jobs")
	_, err := jobs.Attach(ctx, 0)
	must(t, err)
	must(t, jobs.Pause(ctx))
	must(t, jobs.SetRateLimit(ctx, &RateLimit{Limit: 50, Per: 2 * time.Second}))
	must(t, jobs.SetMaxDeliveries(ctx, 2))
	info, err := jobs.Info(ctx)
	must(t, err)
	if !info.Paused || info.RateLimit == nil || *info.RateLimit != (RateLimit{Limit: 50, Per: 2 * time.Second}) || info.MaxDeliveries != 2 {
		t.Fatalf("controls %+v", info)
	}
	must(t, jobs.SetRateLimit(ctx, nil))
	must(t, jobs.Resume(ctx))
	if info, _ = jobs.Info(ctx); info.Paused || info.RateLimit != nil {
		t.Fatalf("controls not cleared: %+v", info)
	}

	_, err = jobs.PushBatch(ctx, []Message{Text("poison"), Text("flaky"), Text("fine")})
	must(t, err)
	consumer := jobs.Consume(ctx, ConsumeOptions{Mode: pb.ConsumeMode_CONSUME_MODE_AT_LEAST_ONCE, Prefetch: 1})
	defer consumer.Stop()
	poison := next(t, consumer.Deliveries())
	must(t, poison.Reject(ctx, "cannot parse"))
	flaky := next(t, consumer.Deliveries())
	must(t, flaky.Nack(ctx, NackOptions{Delay: 500 * time.Millisecond, Error: "try later"}))
	if info, _ = jobs.Info(ctx); info.Delayed != 1 {
		t.Fatalf("delayed %d", info.Delayed)
	}
	fine := next(t, consumer.Deliveries())
	must(t, fine.Ack(ctx))
	again := next(t, consumer.Deliveries())
	if string(again.Payload) != "flaky" || again.DeliveryCount != 2 {
		t.Fatalf("redelivery %q #%d", again.Payload, again.DeliveryCount)
	}
	must(t, again.Nack(ctx, NackOptions{Error: "still failing"})) // max deliveries reached
	consumer.Stop()

	var dead [][3]string
	must(t, jobs.DeadLetters().Browse(ctx, BrowseOptions{}, func(m StoredMessage) bool {
		dead = append(dead, [3]string{string(m.Payload), m.Headers["busmq-dead-reason"], m.Headers["busmq-dead-error"]})
		return true
	}))
	want := [][3]string{{"poison", "rejected", "cannot parse"}, {"flaky", "max-deliveries", "still failing"}}
	if !reflect.DeepEqual(dead, want) {
		t.Fatalf("dead letters %v", dead)
	}
	requeued, err := jobs.RequeueDead(ctx, nil, 1)
	must(t, err)
	var back []string
	must(t, jobs.Browse(ctx, BrowseOptions{FromID: requeued[0]}, func(m StoredMessage) bool {
		back = append(back, string(m.Payload)+"#"+m.Headers["busmq-requeued-id"])
		return true
	}))
	if !reflect.DeepEqual(back, []string{"poison#1"}) {
		t.Fatalf("requeued %v", back)
	}

	for i := 1; i <= 5; i++ {
		queue := client.Queue(fmt.Sprintf("go-listed-%d", i))
		_, err := queue.Attach(ctx, 0)
		must(t, err)
		_, err = queue.PushBatch(ctx, make([]Message, i))
		must(t, err)
	}
	listed, err := client.ListQueues(ctx, "go-listed-", 2)
	must(t, err)
	if len(listed) != 5 {
		t.Fatalf("listed %d queues", len(listed))
	}
	for i, q := range listed {
		if q.Name != fmt.Sprintf("go-listed-%d", i+1) || q.Count != uint64(i+1) {
			t.Fatalf("listed %+v", q)
		}
	}
}

func TestOrderingPerKeyHoldsAKeysNextMessageUntilTheAck(t *testing.T) {
	d := start(t)
	client := dial(t, d, d.secret)
	ctx := context.Background()
	orders := client.Queue("go-ordered")
	_, err := orders.Attach(ctx, 0)
	must(t, err)
	must(t, orders.SetOrdering(ctx, "customer"))
	a := map[string]string{"customer": "a"}
	_, err = orders.PushBatch(ctx, []Message{
		{Payload: []byte("a0"), Headers: a}, {Payload: []byte("a1"), Headers: a},
		{Payload: []byte("b0"), Headers: map[string]string{"customer": "b"}},
	})
	must(t, err)
	consumer := orders.Consume(ctx, ConsumeOptions{Mode: pb.ConsumeMode_CONSUME_MODE_AT_LEAST_ONCE, Prefetch: 10})
	defer consumer.Stop()
	a0, b0 := next(t, consumer.Deliveries()), next(t, consumer.Deliveries())
	if string(a0.Payload) != "a0" || string(b0.Payload) != "b0" { // a1 waits for a0
		t.Fatalf("first deliveries %q %q", a0.Payload, b0.Payload)
	}
	info, err := orders.Info(ctx)
	must(t, err)
	if info.OrderingKey != "customer" || info.OrderedWaiting != 1 || info.OrderedKeysInFlight != 2 {
		t.Fatalf("ordering %+v", info)
	}
	must(t, a0.Ack(ctx))
	if a1 := next(t, consumer.Deliveries()); string(a1.Payload) != "a1" {
		t.Fatalf("after the ack %q", a1.Payload)
	}
}

func TestASchemaRefusesAPushThatDoesNotFitWithWhereAndWhy(t *testing.T) {
	d := start(t)
	client := dial(t, d, d.secret)
	ctx := context.Background()
	orders := client.Queue("go-schema")
	_, err := orders.Attach(ctx, 0)
	must(t, err)
	schema := json.RawMessage(`{"type": "object", "properties": {"id": {"type": "string"},
		"qty": {"type": "integer"}}, "required": ["id", "qty"]}`)
	first, err := orders.SetSchema(ctx, schema, pb.SchemaCompatibility_SCHEMA_COMPATIBILITY_UNSPECIFIED)
	must(t, err)
	if first.Version != 1 {
		t.Fatalf("first version %+v", first)
	}
	_, err = orders.PushBatch(ctx, []Message{JSON(map[string]any{"id": "a", "qty": 1}),
		JSON(map[string]any{"id": "b", "qty": "2"})})
	var refused *Error
	if !errors.Is(err, ErrSchema) || !errors.As(err, &refused) {
		t.Fatalf("a push that does not fit: %v", err)
	}
	if len(refused.Violations) != 1 || refused.Violations[0].Field != "messages[1]/qty" ||
		!strings.HasPrefix(refused.Violations[0].Description, "type: ") {
		t.Fatalf("violations %+v", refused.Violations)
	}
	wider := json.RawMessage(`{"type": "object", "required": ["id", "qty", "sku"]}`)
	_, err = orders.SetSchema(ctx, wider, pb.SchemaCompatibility_SCHEMA_COMPATIBILITY_UNSPECIFIED)
	if !errors.Is(err, ErrSchemaIncompatible) || !errors.As(err, &refused) ||
		len(refused.Violations) != 1 || refused.Violations[0].Description != "field `sku` became required" {
		t.Fatalf("an incompatible version: %v", err)
	}
	_, err = orders.Push(ctx, JSON(map[string]any{"id": "c", "qty": 3}))
	must(t, err)
	violations, err := orders.CheckSchema(ctx, []Message{JSON(map[string]any{"id": "d"})})
	must(t, err)
	if len(violations) != 1 || violations[0].Rule != "required" {
		t.Fatalf("check %+v", violations)
	}
	consumer := orders.Consume(ctx, ConsumeOptions{Mode: pb.ConsumeMode_CONSUME_MODE_AT_MOST_ONCE, Max: 1})
	defer consumer.Stop()
	if delivered := next(t, consumer.Deliveries()); delivered.SchemaVersion != 1 {
		t.Fatalf("delivered %+v", delivered)
	}
	must(t, orders.RemoveSchema(ctx))
	state, err := orders.Schema(ctx)
	must(t, err)
	if state.Current != 0 || len(state.Versions) != 1 {
		t.Fatalf("after remove %+v", state)
	}
}

func TestAProtobufSchemaRefusesAPayloadThatDoesNotParse(t *testing.T) {
	d := start(t)
	client := dial(t, d, d.secret)
	ctx := context.Background()
	typed := client.Queue("go-proto")
	_, err := typed.Attach(ctx, 0)
	must(t, err)
	set, err := proto.Marshal(&descriptorpb.FileDescriptorSet{File: []*descriptorpb.FileDescriptorProto{{
		Name: proto.String("order.proto"), Package: proto.String("shop"), Syntax: proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{{
			Name: proto.String("Order"),
			Field: []*descriptorpb.FieldDescriptorProto{{
				Name: proto.String("id"), Number: proto.Int32(1),
				Type:  descriptorpb.FieldDescriptorProto_TYPE_STRING.Enum(),
				Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum(),
			}},
		}},
	}}})
	must(t, err)
	version, err := typed.SetProtobufSchema(ctx, set, "shop.Order", false, pb.SchemaCompatibility_SCHEMA_COMPATIBILITY_UNSPECIFIED)
	must(t, err)
	if version.Protobuf.GetMessage() != "shop.Order" || version.Schema != nil {
		t.Fatalf("version %+v", version)
	}
	_, err = typed.Push(ctx, Message{Payload: []byte{0x0a, 0x01, 'a'}}) // id = "a"
	must(t, err)
	_, err = typed.Push(ctx, Message{Payload: []byte{0xff, 0xff}})
	var refused *Error
	if !errors.Is(err, ErrSchema) || !errors.As(err, &refused) || len(refused.Violations) != 1 ||
		refused.Violations[0].Field != "messages[0]" || !strings.HasPrefix(refused.Violations[0].Description, "protobuf: ") {
		t.Fatalf("a payload that does not parse: %v", err)
	}
}

func TestBrowseFollowsNewMessagesUntilTheVisitStops(t *testing.T) {
	d := start(t)
	client := dial(t, d, d.secret)
	ctx := context.Background()
	feed := client.Queue("go-feed")
	_, err := feed.Attach(ctx, 0)
	must(t, err)
	_, err = feed.Push(ctx, Text("first"))
	must(t, err)
	var seen []string
	must(t, feed.Browse(ctx, BrowseOptions{Follow: true}, func(m StoredMessage) bool {
		seen = append(seen, string(m.Payload))
		if len(seen) == 1 {
			go feed.Push(ctx, Text("second"))
			return true
		}
		return false
	}))
	if !reflect.DeepEqual(seen, []string{"first", "second"}) {
		t.Fatalf("seen %v", seen)
	}
}

func TestAPersistableIsSharedWithPython(t *testing.T) {
	d := start(t)
	client := dial(t, d, d.secret)
	ctx := context.Background()
	saved := pythonBus(d, `
        cart = bus.persistable("go-cart", {"items": [], "total": 0}, ttl=60)
        cart.update({"items": ["book"], "total": 12})
        await cart.save()
`)
	if out, err := saved.CombinedOutput(); err != nil {
		t.Fatalf("python: %v %s", err, out)
	}
	cart, err := client.Persistable("go-cart", map[string]interface{}{"items": []string{}, "total": 0, "note": "none"}, time.Minute)
	must(t, err)
	existed, err := cart.Load(ctx)
	must(t, err)
	var items []string
	var total int
	must(t, cart.Get("items", &items))
	must(t, cart.Get("total", &total))
	if !existed || !reflect.DeepEqual(items, []string{"book"}) || total != 12 {
		t.Fatalf("loaded %v %v %v", existed, items, total)
	}
	if !reflect.DeepEqual(cart.Changed(), []string{"note"}) {
		t.Fatalf("changed %v", cart.Changed())
	}
	must(t, cart.Set("items", append(items, "pen")))
	must(t, cart.Set("total", 15))
	written, err := cart.Save(ctx)
	must(t, err)
	if !reflect.DeepEqual(written, []string{"items", "note", "total"}) {
		t.Fatalf("written %v", written)
	}
	if ttl, ok, err := cart.RemainingTTL(ctx); err != nil || !ok || ttl <= 50*time.Second {
		t.Fatalf("ttl %v %v %v", ttl, ok, err)
	}
	loaded := pythonBus(d, `
        cart = bus.persistable("go-cart", ["items", "total", "note"])
        print(json.dumps({"existed": await cart.load(), "values": dict(cart)}))
`)
	out, err := loaded.Output()
	must(t, err)
	if strings.TrimSpace(string(out)) != `{"existed": true, "values": {"items": ["book", "pen"], "total": 15, "note": "none"}}` {
		t.Fatalf("python loaded %s", out)
	}
	other, err := client.Persistable("go-cart", map[string]interface{}{"total": 0}, 0)
	must(t, err)
	_, err = other.Save(ctx) // an untouched default does not overwrite the stored value
	must(t, err)
	must(t, other.Get("total", &total))
	if total != 15 {
		t.Fatalf("a default overwrote the stored total: %d", total)
	}
	must(t, cart.Delete(ctx))
	if existed, err := other.Load(ctx); err != nil || existed {
		t.Fatalf("deleted object loaded: %v %v", existed, err)
	}
}

func TestRequestReplyWithPythonAndGoHandlers(t *testing.T) {
	d := start(t)
	client := dial(t, d, d.secret)
	ctx := context.Background()
	handler := pythonOn(d, "")
	handler.Args = []string{handler.Args[0], "-m", "tests.support.service_worker",
		fmt.Sprintf(`["redis://127.0.0.1:%d"]`, d.redisPort), "py-double"}
	waitFor(t, handler, `"serving"`)
	t.Cleanup(func() { stop(t, handler, syscall.SIGTERM) })
	reply, err := client.Service("py-double").Request(ctx, JSON(map[string]interface{}{"op": "double", "n": 21}), 10*time.Second)
	must(t, err)
	var doubled map[string]int
	must(t, json.Unmarshal(reply.Payload, &doubled))
	if doubled["double"] != 42 {
		t.Fatalf("reply %s", reply.Payload)
	}
	var items []string
	must(t, client.Service("py-double").RequestStream(ctx, JSON(map[string]interface{}{"op": "count", "to": 3}), 0,
		func(item Reply) error {
			items = append(items, string(item.Payload))
			return nil
		}))
	if !reflect.DeepEqual(items, []string{"0", "1", "2"}) {
		t.Fatalf("streamed %v", items)
	}

	server := client.Service("go-upper").Serve(ctx, func(ctx context.Context, request ServedRequest) (Message, error) {
		if string(request.Payload) == "" {
			return Message{}, errors.New("nothing to upper-case")
		}
		return Text(strings.ToUpper(string(request.Payload))), nil
	}, ServeOptions{Concurrency: 4})
	defer server.Stop()
	upper, err := client.Service("go-upper").Request(ctx, Text("shout"), 10*time.Second)
	must(t, err)
	if string(upper.Payload) != "SHOUT" || upper.Kind != pb.PayloadKind_PAYLOAD_KIND_TEXT {
		t.Fatalf("reply %q", upper.Payload)
	}
	_, err = client.Service("go-upper").Request(ctx, Text(""), 10*time.Second)
	if !errors.Is(err, ErrHandlerFailed) || !strings.Contains(err.Error(), "nothing to upper-case") {
		t.Fatalf("handler failure came back as %v", err)
	}
	if err := server.Stop(); err != nil {
		t.Fatal(err)
	}

	counter := client.Service("go-count").ServeStream(ctx, func(ctx context.Context, request ServedRequest, send func(Message) error) error {
		var to int
		if err := json.Unmarshal(request.Payload, &to); err != nil {
			return err
		}
		for i := 0; i < to; i++ {
			if err := send(JSON(i)); err != nil {
				return err
			}
		}
		return nil
	}, ServeOptions{})
	defer counter.Stop()
	items = nil
	must(t, client.Service("go-count").RequestStream(ctx, JSON(3), 0, func(item Reply) error {
		items = append(items, string(item.Payload))
		return nil
	}))
	if !reflect.DeepEqual(items, []string{"0", "1", "2"}) {
		t.Fatalf("streamed from Go %v", items)
	}
	// A Python requester reads the whole streamed reply of the Go handler.
	asked := pythonBus(d, `
        print(await bus.service("go-count").request(4, timeout=10))
`)
	out, err := asked.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "[0, 1, 2, 3]" {
		t.Fatalf("python asked the Go handler: %v %s", err, out)
	}
}

func TestAGoChannelTalksToAPythonEnd(t *testing.T) {
	d := start(t)
	client := dial(t, d, d.secret)
	ctx := context.Background()
	python := pythonBus(d, `
        end = bus.channel("go-chat", local="py", remote="go")
        await end.connect()
        print("connected", flush=True)
        async for delivery in end:
            await end.send({"echo": delivery.data, "from": "python"})
            break
        await asyncio.sleep(30)  # stays connected until the test ends the channel
`)
	waitFor(t, python, "connected")
	t.Cleanup(func() { stop(t, python, syscall.SIGTERM) })
	var events []string
	end := client.Channel("go-chat", ChannelRoles{Local: "go", Remote: "py"})
	must(t, end.Connect(ctx, ChannelOptions{Mode: pb.ConsumeMode_CONSUME_MODE_AT_LEAST_ONCE,
		OnEvent: func(e ChannelEvent) { events = append(events, e.Kind) }}))
	if end.Role() != "go" || end.PeerRole() != "py" {
		t.Fatalf("roles %s %s", end.Role(), end.PeerRole())
	}
	_, err := end.Send(ctx, JSON(map[string]int{"n": 7}))
	must(t, err)
	select {
	case message := <-end.Messages():
		var echo struct {
			Echo map[string]int
			From string
		}
		must(t, json.Unmarshal(message.Payload, &echo))
		if echo.Echo["n"] != 7 || echo.From != "python" {
			t.Fatalf("echo %s", message.Payload)
		}
		must(t, message.Ack(ctx))
	case <-time.After(10 * time.Second):
		t.Fatal("no echo from the Python end")
	}
	must(t, end.End(ctx))
	if err := end.Err(); err != nil { // also: the end's goroutine is done with events
		t.Fatal(err)
	}
	if len(events) == 0 || events[0] != "connected" {
		t.Fatalf("events %v", events)
	}
}

func TestAGoChannelEndResumesAfterAGatewayCrash(t *testing.T) {
	d := start(t)
	client := dial(t, d, d.secret)
	ctx := context.Background()
	connected := map[string]chan struct{}{"a": make(chan struct{}, 4), "b": make(chan struct{}, 4)}
	open := func(local, remote string, mode pb.ConsumeMode) *ChannelEnd {
		end := client.Channel("go-resume", ChannelRoles{Local: local, Remote: remote})
		must(t, end.Connect(ctx, ChannelOptions{Mode: mode, VisibilityTimeout: time.Second,
			OnEvent: func(e ChannelEvent) {
				if e.Kind == "connected" {
					connected[local] <- struct{}{}
				}
			}}))
		return end
	}
	a := open("a", "b", pb.ConsumeMode_CONSUME_MODE_AT_LEAST_ONCE)
	b := open("b", "a", pb.ConsumeMode_CONSUME_MODE_AT_MOST_ONCE)
	defer b.Close()
	for _, c := range connected {
		<-c
	}
	_, err := b.Send(ctx, Text("before the crash"))
	must(t, err)
	first := <-a.Messages() // not acked
	if string(first.Payload) != "before the crash" {
		t.Fatalf("got %q", first.Payload)
	}
	stop(t, d.gateway, syscall.SIGKILL)
	d.startGateway()
	for name, c := range connected {
		select {
		case <-c:
		case <-time.After(20 * time.Second):
			t.Fatalf("end %s did not reconnect", name)
		}
	}
	_, err = b.Send(ctx, Text("after the restart"))
	must(t, err)
	// At least once: the unacked message comes again (a redelivery may come twice when
	// the visibility timeout passes while it waits in the read-ahead).
	seen := map[string]uint32{}
	for len(seen) < 2 {
		select {
		case m := <-a.Messages():
			if _, again := seen[string(m.Payload)]; !again {
				seen[string(m.Payload)] = m.DeliveryCount
			}
			must(t, m.Ack(ctx))
		case <-time.After(10 * time.Second):
			t.Fatalf("only %v", seen)
		}
	}
	if seen["after the restart"] != 1 || seen["before the crash"] < 2 {
		t.Fatalf("seen %v", seen)
	}
	must(t, a.End(ctx))
	if a.Resumes < 1 {
		t.Fatalf("resumes %d", a.Resumes)
	}
}

func TestClosingTheClientStopsItsLoopsEvenWithTheGatewayGone(t *testing.T) {
	d := start(t)
	client := dial(t, d, d.secret)
	ctx := context.Background()
	queue := client.Queue("go-orphan")
	if _, err := queue.Attach(ctx, 0); err != nil {
		t.Fatal(err)
	}
	consumer := queue.Consume(ctx, ConsumeOptions{})
	end := client.Channel("go-orphan", ChannelRoles{Local: "a", Remote: "b"})
	must(t, end.Connect(ctx, ChannelOptions{}))
	server := client.Service("go-orphan").Serve(ctx, func(context.Context, ServedRequest) (Message, error) {
		return Text("ok"), nil
	}, ServeOptions{})
	stop(t, d.gateway, syscall.SIGKILL) // each now retries with backoff, against nothing
	must(t, client.Close())
	within := func(what string, done func()) {
		finished := make(chan struct{})
		go func() { done(); close(finished) }()
		select {
		case <-finished:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: not stopped within 5 s of Close", what)
		}
	}
	within("the consumer", func() {
		for range consumer.Deliveries() {
		}
	})
	within("the channel end", func() {
		for range end.Messages() {
		}
	})
	within("the server", func() { _ = server.Wait() })
}
