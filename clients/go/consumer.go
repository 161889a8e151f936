package busmq

import (
	"context"
	"io"
	"sync/atomic"
	"time"

	pb "busmq.dev/go/gen/busmq/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
)

// ConsumeOptions says how to consume (the zero value: at-most-once, gateway defaults).
type ConsumeOptions struct {
	Mode pb.ConsumeMode
	// Max stops the consumer after this many deliveries (0: no limit).
	Max uint64
	// Prefetch bounds the read-ahead (0: the gateway's default).
	Prefetch uint32
	// FromID is the first id a replay reads (0: the oldest retained).
	FromID uint64
	// VisibilityTimeout: at-least-once deliveries unacked this long are redelivered.
	VisibilityTimeout time.Duration
}

// Delivery is one message handed to a consumer.
type Delivery struct {
	ID            uint64
	Payload       []byte
	Kind          pb.PayloadKind
	Headers       map[string]string
	DeliveryCount uint32
	// SchemaVersion is the version of the queue's schema the message was checked
	// against when pushed (0: the queue had no schema).
	SchemaVersion uint32
	consumer      *Consumer
}

// Ack acknowledges an at-least-once delivery (acks waiting together go in one call);
// a no-op in the other modes.
func (d Delivery) Ack(ctx context.Context) error {
	if d.consumer.options.Mode != pb.ConsumeMode_CONSUME_MODE_AT_LEAST_ONCE {
		return nil
	}
	done := make(chan error, 1)
	select {
	case d.consumer.acks <- ack{d.ID, done}:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

type ack struct {
	id   uint64
	done chan error
}

// Consumer delivers a queue's messages on a channel, reopening its stream with backoff
// when it breaks: at-least-once deliveries unacked at the break come again, a replay
// continues after the last id it saw, Max counts across streams.
type Consumer struct {
	queue      *Queue
	options    ConsumeOptions
	deliveries chan Delivery
	acks       chan ack
	stop       context.CancelFunc
	err        error
	delivered  uint64
	lastID     uint64
	// Resumes counts the streams reopened after a break (read after Deliveries closed).
	Resumes int
	// lapsed counts the at-least-once deliveries not handed out because their
	// visibility timeout ran out on the way (see Lapsed).
	lapsed atomic.Uint64
	// consumerID is the gateway's id of the current stream's consumer (a string).
	consumerID atomic.Value
}

// Consume starts consuming; read Deliveries until it is closed, then Err.
func (q *Queue) Consume(ctx context.Context, options ConsumeOptions) *Consumer {
	ctx, stop := q.client.whileOpen(ctx)
	c := &Consumer{queue: q, options: options, deliveries: make(chan Delivery), acks: make(chan ack), stop: stop}
	go c.run(ctx)
	go c.ackLoop(ctx)
	return c
}

// Deliveries is closed when the consumer ends (Max reached, queue closed, Stop, or an
// error that is not a broken stream: see Err).
func (c *Consumer) Deliveries() <-chan Delivery { return c.deliveries }

// Err is why the consumer ended (nil after Max, a closed queue or Stop).
func (c *Consumer) Err() error { return c.err }

// Lapsed is how many at-least-once deliveries were not handed out because their
// visibility timeout ran out on the way (the gateway read them that long ago): any
// consumer may have claimed them, and they come again.
func (c *Consumer) Lapsed() uint64 { return c.lapsed.Load() }

// Stop ends the consumer.
func (c *Consumer) Stop() { c.stop() }

func (c *Consumer) run(ctx context.Context) {
	defer close(c.deliveries)
	c.err = resumeLoop(ctx, func(ctx context.Context, started func()) (bool, error) {
		if c.reachedMax() {
			return true, nil
		}
		return c.stream(ctx, started)
	}, func(error) { c.Resumes++ }) // broken, or ended by a draining gateway
}

// stream runs one Consume stream; ended says the consumer is done (Max or closed).
func (c *Consumer) stream(ctx context.Context, started func()) (ended bool, err error) {
	request := &pb.ConsumeRequest{
		Queue:    c.queue.Name,
		Mode:     c.options.Mode,
		FromId:   c.options.FromID,
		Prefetch: c.options.Prefetch,
		Batch:    true,
	}
	if c.lastID > 0 {
		request.FromId = c.lastID + 1
	}
	if c.options.Max > 0 {
		request.Max = c.options.Max - c.delivered
	}
	if c.options.VisibilityTimeout > 0 {
		request.VisibilityTimeout = durationpb.New(c.options.VisibilityTimeout)
	}
	stream, err := c.queue.client.Queues.Consume(ctx, request)
	if err != nil {
		return false, asError(err)
	}
	var startedAt time.Time // what a batch's LapsesAfter counts from
	for {
		response, err := stream.Recv()
		if err == io.EOF {
			return c.reachedMax(), nil
		}
		if err != nil {
			return false, asError(err)
		}
		switch event := response.Event.(type) {
		case *pb.ConsumeResponse_Delivery:
			if !c.deliver(ctx, event.Delivery, nil) {
				return true, nil
			}
		case *pb.ConsumeResponse_Batch:
			if !c.deliverBatch(ctx, event.Batch, startedAt) {
				return true, nil
			}
		case *pb.ConsumeResponse_Started:
			startedAt = time.Now()
			c.consumerID.Store(event.Started.ConsumerId)
			started()
		case *pb.ConsumeResponse_State:
			if event.State.Kind == "closed" {
				return true, nil
			}
		}
	}
}

// deliverBatch hands a batch out in order, but none of it once its lease ran out
// (at-least-once: LapsesAfter, counted from the stream's start); false when ctx ended.
func (c *Consumer) deliverBatch(ctx context.Context, batch *pb.DeliveryBatch, startedAt time.Time) bool {
	var lapses <-chan time.Time
	var deadline time.Time
	if batch.LapsesAfter != nil {
		deadline = startedAt.Add(batch.LapsesAfter.AsDuration())
		timer := time.NewTimer(time.Until(deadline))
		defer timer.Stop()
		lapses = timer.C
	}
	for i, delivery := range batch.Deliveries {
		if lapses != nil && !time.Now().Before(deadline) {
			c.lapsed.Add(uint64(len(batch.Deliveries) - i))
			return true
		}
		handed := c.deliver(ctx, delivery, lapses)
		if ctx.Err() != nil {
			return false
		}
		if !handed {
			c.lapsed.Add(uint64(len(batch.Deliveries) - i))
			return true
		}
	}
	return true
}

// deliver hands one delivery out; false if ctx ended or lapses fired first.
func (c *Consumer) deliver(ctx context.Context, wire *pb.Delivery, lapses <-chan time.Time) bool {
	m := wire.Message
	delivery := Delivery{
		ID: m.Id, Payload: m.Payload, Kind: m.Kind, Headers: m.Headers,
		DeliveryCount: wire.DeliveryCount, SchemaVersion: m.SchemaVersion, consumer: c,
	}
	select {
	case c.deliveries <- delivery:
		c.delivered++
		if c.options.Mode == pb.ConsumeMode_CONSUME_MODE_REPLAY {
			c.lastID = m.Id
		}
		return true
	case <-lapses:
		return false
	case <-ctx.Done():
		return false
	}
}

func (c *Consumer) reachedMax() bool {
	return c.options.Max > 0 && c.delivered >= c.options.Max
}

// ackLoop sends the acks waiting at once in one call.
func (c *Consumer) ackLoop(ctx context.Context) {
	for {
		var batch []ack
		select {
		case <-ctx.Done():
			return
		case first := <-c.acks:
			batch = append(batch, first)
		}
	more:
		for {
			select {
			case next := <-c.acks:
				batch = append(batch, next)
			default:
				break more
			}
		}
		ids := make([]uint64, len(batch))
		for i, a := range batch {
			ids[i] = a.id
		}
		err := c.queue.client.unary(context.Background(), func(ctx context.Context) error {
			_, err := c.queue.client.Queues.Ack(ctx, &pb.AckRequest{Queue: c.queue.Name, Ids: ids})
			return err
		})
		for _, a := range batch {
			a.done <- err
		}
	}
}

// streamResumable says whether a stream that ended with err is to be reopened: the
// gateway or its Redis was away, or the connection broke (no ErrorInfo).
func streamResumable(err *Error) bool {
	if err.Retryable() {
		return true
	}
	fromTransport := err.Reason == err.Code.String()
	return fromTransport && (err.Code == codes.Internal || err.Code == codes.Unknown ||
		err.Code == codes.Aborted || err.Code == codes.Canceled)
}
