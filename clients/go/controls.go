package busmq

// The processing controls and listings of the gateway's QueueService: pause, rate
// limits, max deliveries, nack with a delay, reject, dead letters, ListQueues and
// BrowseQueue.

import (
	"context"
	"io"
	"time"

	pb "busmq.dev/go/gen/busmq/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// RateLimit is at most Limit deliveries per Per (default a second) for every consumer
// together; with Key, per value of that header (for example per tenant).
type RateLimit struct {
	Limit uint32
	Per   time.Duration
	Key   string
}

func (r RateLimit) wire() *pb.RateLimit {
	per := r.Per
	if per == 0 {
		per = time.Second
	}
	return &pb.RateLimit{Limit: r.Limit, Per: durationpb.New(per), Key: r.Key}
}

func rateLimitOf(wire *pb.RateLimit) *RateLimit {
	if wire == nil || wire.Limit == 0 {
		return nil
	}
	return &RateLimit{Limit: wire.Limit, Per: wire.Per.AsDuration(), Key: wire.Key}
}

func (q *Queue) updateControls(ctx context.Context, request *pb.UpdateQueueControlsRequest) error {
	request.Queue = q.Name
	return q.client.unary(ctx, func(ctx context.Context) error {
		_, err := q.client.Queues.UpdateQueueControls(ctx, request)
		return err
	})
}

// Pause stops deliveries (reads return nothing; pushes go on) until Resume.
func (q *Queue) Pause(ctx context.Context) error {
	return q.updateControls(ctx, &pb.UpdateQueueControlsRequest{Paused: proto.Bool(true)})
}

// Resume ends a Pause.
func (q *Queue) Resume(ctx context.Context) error {
	return q.updateControls(ctx, &pb.UpdateQueueControlsRequest{Paused: proto.Bool(false)})
}

// SetRateLimit limits deliveries; nil removes the queue's rate limits.
func (q *Queue) SetRateLimit(ctx context.Context, limit *RateLimit) error {
	if limit == nil {
		return q.updateControls(ctx, &pb.UpdateQueueControlsRequest{RemoveRateLimits: true})
	}
	return q.updateControls(ctx, &pb.UpdateQueueControlsRequest{RateLimit: limit.wire()})
}

// SetMaxDeliveries sends the delivery after n failed ones to the dead letters (0: no
// limit).
func (q *Queue) SetMaxDeliveries(ctx context.Context, n uint32) error {
	return q.updateControls(ctx, &pb.UpdateQueueControlsRequest{MaxDeliveries: proto.Uint32(n)})
}

// DropExpired drops expired messages instead of dead-lettering them.
func (q *Queue) DropExpired(ctx context.Context, drop bool) error {
	return q.updateControls(ctx, &pb.UpdateQueueControlsRequest{DropExpired: proto.Bool(drop)})
}

// SetOrdering orders deliveries per the value of header key: one delivery per key in
// flight, in push order, across every consumer; "" stops ordering. It needs at-least-once
// consumers (FAILED_PRECONDITION, reason ORDERING, on a replay queue).
func (q *Queue) SetOrdering(ctx context.Context, key string) error {
	return q.updateControls(ctx, &pb.UpdateQueueControlsRequest{OrderingKey: proto.String(key)})
}

// RequeueDead moves dead letters back into the queue as new messages, oldest first:
// those with ids, or all of them (at most limit when it is not 0). Returns their new ids;
// header busmq-requeued-id holds the id each had.
func (q *Queue) RequeueDead(ctx context.Context, ids []uint64, limit uint64) ([]uint64, error) {
	var reply *pb.RequeueDeadResponse
	err := q.client.unary(ctx, func(ctx context.Context) (err error) {
		reply, err = q.client.Queues.RequeueDead(ctx, &pb.RequeueDeadRequest{Queue: q.Name, Ids: ids, Limit: limit})
		return err
	})
	if err != nil {
		return nil, err
	}
	return reply.Ids, nil
}

// DeadLetters is the queue's dead-letter queue, <name>:dead: a normal queue, whose
// messages carry busmq-dead-reason (max-deliveries, rejected, expired) and
// busmq-dead-error.
func (q *Queue) DeadLetters() *Queue {
	return q.client.Queue(q.Name + ":dead")
}

// NackOptions says when a delivery given back comes again.
type NackOptions struct {
	// Delay before it is delivered again (0: at the next read).
	Delay time.Duration
	// Error is noted for its dead letter, should it end there.
	Error string
}

// Nack gives an at-least-once delivery back.
func (d Delivery) Nack(ctx context.Context, options NackOptions) error {
	queue := d.consumer.queue
	request := &pb.NackRequest{Queue: queue.Name, ConsumerId: d.consumer.id(), Ids: []uint64{d.ID}, Error: options.Error}
	if options.Delay > 0 {
		request.Delay = durationpb.New(options.Delay)
	}
	return queue.client.unary(ctx, func(ctx context.Context) error {
		_, err := queue.client.Queues.Nack(ctx, request)
		return err
	})
}

// Reject moves an at-least-once delivery to the dead letters now (reason "rejected",
// with reason as its error).
func (d Delivery) Reject(ctx context.Context, reason string) error {
	queue := d.consumer.queue
	request := &pb.RejectRequest{Queue: queue.Name, ConsumerId: d.consumer.id(), Ids: []uint64{d.ID}, Reason: reason}
	return queue.client.unary(ctx, func(ctx context.Context) error {
		_, err := queue.client.Queues.Reject(ctx, request)
		return err
	})
}

func (c *Consumer) id() string {
	id, _ := c.consumerID.Load().(string)
	return id
}

// QueueSummary is one queue of a listing: its counts and controls as Redis holds them.
type QueueSummary struct {
	Name, Shard, Mode              string
	Count, Ready, Pending, Delayed uint64
	DeadLetters, LastID, Delivered uint64
	OldestPending                  time.Duration
	Consumers, Attachments         uint32
	Paused                         bool
	RateLimit                      *RateLimit
}

// ListQueues returns the queues whose names start with prefix that this principal may
// see, in name order, reading pageSize at a time (0: the gateway's default).
func (c *Client) ListQueues(ctx context.Context, prefix string, pageSize uint32) ([]QueueSummary, error) {
	var queues []QueueSummary
	token := ""
	for {
		var reply *pb.ListQueuesResponse
		err := c.unary(ctx, func(ctx context.Context) (err error) {
			reply, err = c.Queues.ListQueues(ctx, &pb.ListQueuesRequest{Prefix: prefix, PageSize: pageSize, PageToken: token})
			return err
		})
		if err != nil {
			return nil, err
		}
		for _, q := range reply.Queues {
			queues = append(queues, QueueSummary{
				Name: q.Queue, Shard: q.Shard, Mode: q.Mode, Count: q.Count, Ready: q.Ready,
				Pending: q.Pending, Delayed: q.Delayed, DeadLetters: q.DeadLetters, LastID: q.LastId,
				Delivered: q.Delivered, OldestPending: q.OldestPending.AsDuration(),
				Consumers: q.Consumers, Attachments: q.Attachments, Paused: q.Paused,
				RateLimit: rateLimitOf(q.RateLimit),
			})
		}
		if token = reply.NextPageToken; token == "" {
			return queues, nil
		}
	}
}

// StoredMessage is a message read without consuming it.
type StoredMessage struct {
	ID       uint64
	Payload  []byte
	Kind     pb.PayloadKind
	Headers  map[string]string
	PushTime time.Time
}

// BrowseOptions says what to browse: FromID up to ToID (inclusive; 0: what is stored
// now), or with Follow, then each new message as it is stored.
type BrowseOptions struct {
	FromID, ToID uint64
	Follow       bool
}

// Browse calls visit with the stored messages in order, without consuming, acking or
// fixing the queue's mode, until they are read (or, with Follow, until visit returns
// false or ctx ends).
func (q *Queue) Browse(ctx context.Context, options BrowseOptions, visit func(StoredMessage) bool) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // leaving early ends the stream
	stream, err := q.client.Queues.BrowseQueue(ctx, &pb.BrowseQueueRequest{
		Queue: q.Name, FromId: options.FromID, ToId: options.ToID, Follow: options.Follow,
	})
	if err != nil {
		return asError(err)
	}
	return receive(stream.Recv, func(response *pb.BrowseQueueResponse) (bool, error) {
		batch, ok := response.Event.(*pb.BrowseQueueResponse_Messages)
		if !ok {
			return true, nil
		}
		for _, m := range batch.Messages.Messages {
			message := StoredMessage{ID: m.Id, Payload: m.Payload, Kind: m.Kind, Headers: m.Headers}
			if m.PushTime != nil {
				message.PushTime = m.PushTime.AsTime()
			}
			if !visit(message) {
				return false, nil
			}
		}
		return true, nil
	})
}

// receive calls each with a stream's responses until the stream ends (nil), fails, or
// each says to stop.
func receive[T any](recv func() (T, error), each func(T) (bool, error)) error {
	for {
		response, err := recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return asError(err)
		}
		if more, err := each(response); err != nil || !more {
			return err
		}
	}
}
