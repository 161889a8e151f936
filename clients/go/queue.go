package busmq

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"sync"
	"time"

	pb "busmq.dev/go/gen/busmq/v1"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Queue is queue Name on the gateway. Attach creates it and keeps it alive until Detach.
type Queue struct {
	client *Client
	Name   string

	mu           sync.Mutex
	attachmentID string
	stopRenewal  context.CancelFunc
}

// Queue returns a handle on queue name.
func (c *Client) Queue(name string) *Queue {
	return &Queue{client: c, Name: name}
}

// Attach attaches (creating the queue if needed) and renews the lease in the background
// every third of its duration until Detach; returns whether this attach created it.
func (q *Queue) Attach(ctx context.Context, ttl time.Duration) (bool, error) {
	request := &pb.AttachQueueRequest{Queue: q.Name}
	if ttl > 0 {
		request.Ttl = durationpb.New(ttl)
	}
	var reply *pb.AttachQueueResponse
	err := q.client.unary(ctx, func(ctx context.Context) (err error) {
		reply, err = q.client.Queues.AttachQueue(ctx, request)
		return err
	})
	if err != nil {
		return false, err
	}
	lease := reply.LeaseDuration.AsDuration()
	if lease <= 0 {
		lease = 30 * time.Second
	}
	renewCtx, stop := q.client.whileOpen(context.Background())
	q.mu.Lock()
	if q.stopRenewal != nil {
		q.stopRenewal()
	}
	q.attachmentID, q.stopRenewal = reply.AttachmentId, stop
	q.mu.Unlock()
	go q.renew(renewCtx, reply.AttachmentId, lease, ttl)
	return reply.Created, nil
}

func (q *Queue) renew(ctx context.Context, attachmentID string, lease, ttl time.Duration) {
	delay := lease / 3
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		err := q.client.unary(ctx, func(ctx context.Context) error {
			_, err := q.client.Queues.RenewAttachment(ctx, &pb.RenewAttachmentRequest{AttachmentId: attachmentID})
			return err
		})
		switch {
		case err == nil:
			delay = lease / 3
		case ctx.Err() != nil:
			return
		case errors.Is(err, &Error{Reason: "ATTACHMENT_NOT_FOUND"}):
			// The lease lapsed (the gateway was away longer than it): attach again.
			if _, err := q.Attach(context.Background(), ttl); err == nil {
				return // Attach started a new renewal
			}
			delay = time.Second
		default:
			delay = lease / 6 // retry soon
		}
	}
}

// Detach releases the attachment: the queue expires its ttl after its last one.
func (q *Queue) Detach(ctx context.Context) error {
	q.mu.Lock()
	attachmentID, stop := q.attachmentID, q.stopRenewal
	q.attachmentID, q.stopRenewal = "", nil
	q.mu.Unlock()
	if stop != nil {
		stop()
	}
	if attachmentID == "" {
		return nil
	}
	return q.client.unary(ctx, func(ctx context.Context) error {
		_, err := q.client.Queues.DetachQueue(ctx, &pb.DetachQueueRequest{AttachmentId: attachmentID})
		return err
	})
}

// Message is one message to push.
type Message struct {
	Payload []byte
	// Kind says how consumers read the payload (default bytes).
	Kind    pb.PayloadKind
	Headers map[string]string
}

// Text is a text message.
func Text(text string) Message {
	return Message{Payload: []byte(text), Kind: pb.PayloadKind_PAYLOAD_KIND_TEXT}
}

// PushBatch pushes messages atomically and in order and returns their ids. It carries a
// generated request id and is retried with it while the gateway is unavailable (until
// ctx ends), so it is stored once. Pushes go over the client's one PushStream (a
// gateway without it gets calls: pushes made while one is under way share the next),
// each answered on its own.
func (q *Queue) PushBatch(ctx context.Context, messages []Message) ([]uint64, error) {
	return q.send(ctx, messages, func(ctx context.Context, messages []Message) ([]uint64, error) {
		return q.push(ctx, q.request(messages))
	})
}

// Producer is an idempotent producer: its pushes are stored once per queue, producer
// and sequence, with no time window. A push with a lower Epoch than the queue has seen
// is refused with ErrProducerFenced (a newer instance of the producer has pushed).
type Producer struct {
	Name  string
	Epoch uint64
}

// PushSequenced pushes messages atomically as producer's push number sequence and
// returns their ids. A repeat of the producer's last push stores nothing and returns
// its ids; a sequence below that stores nothing and returns no ids. Sequences must
// increase (gaps are allowed).
func (q *Queue) PushSequenced(ctx context.Context, producer Producer, sequence uint64, messages []Message) ([]uint64, error) {
	return q.send(ctx, messages, func(ctx context.Context, messages []Message) ([]uint64, error) {
		request := q.request(messages)
		request.Producer, request.ProducerEpoch, request.ProducerSequence = producer.Name, producer.Epoch, sequence
		return q.push(ctx, request)
	})
}

func (q *Queue) request(messages []Message) *pb.PushRequest {
	request := &pb.PushRequest{Queue: q.Name, RequestId: newRequestID()}
	for _, m := range messages {
		request.Messages = append(request.Messages, &pb.OutgoingMessage{Payload: m.Payload, Kind: m.Kind, Headers: m.Headers})
	}
	return request
}

// push sends request, retried with its request id while the gateway is unavailable.
func (q *Queue) push(ctx context.Context, request *pb.PushRequest) ([]uint64, error) {
	backoff := 50 * time.Millisecond
	for {
		ids, err := q.client.pushes.push(ctx, request)
		if err == nil {
			return ids, nil
		}
		var busError *Error
		if !errors.As(err, &busError) || !busError.Retryable() {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(backoff):
		}
		if backoff < time.Second {
			backoff *= 2
		}
	}
}

// Push pushes one message and returns its id.
func (q *Queue) Push(ctx context.Context, message Message) (uint64, error) {
	ids, err := q.PushBatch(ctx, []Message{message})
	if err != nil {
		return 0, err
	}
	return ids[0], nil
}

// Info is a queue's counters and the controls in force.
type Info struct {
	Count, LastID, Pending, Delayed, DeadLetters uint64
	TTL                                          time.Duration
	Metadata                                     map[string]string
	// Mode is "" until the first consumer fixes it.
	Mode          string
	Paused        bool
	RateLimit     *RateLimit
	KeyRateLimit  *RateLimit
	MaxDeliveries uint32
	DropExpired   bool
	// OrderingKey is the header whose value orders deliveries per key ("": not ordered);
	// with it, the keys with a delivery in flight, the messages waiting for their key and
	// how long the oldest of them has been in the queue.
	OrderingKey         string
	OrderedKeysInFlight uint64
	OrderedWaiting      uint64
	OldestOrderedWait   time.Duration
}

// Info returns the queue's counters, ttl, metadata and controls.
func (q *Queue) Info(ctx context.Context) (Info, error) {
	var reply *pb.GetQueueResponse
	err := q.client.unary(ctx, func(ctx context.Context) (err error) {
		reply, err = q.client.Queues.GetQueue(ctx, &pb.GetQueueRequest{Queue: q.Name})
		return err
	})
	if err != nil {
		return Info{}, err
	}
	return Info{
		Count: reply.Count, LastID: reply.LastId, Pending: reply.Pending, Delayed: reply.Delayed,
		DeadLetters: reply.DeadLetters, TTL: reply.Ttl.AsDuration(), Metadata: reply.Metadata,
		Mode: reply.Mode, Paused: reply.Paused, RateLimit: rateLimitOf(reply.RateLimit),
		KeyRateLimit: rateLimitOf(reply.KeyRateLimit), MaxDeliveries: reply.MaxDeliveries,
		DropExpired: reply.DropExpired, OrderingKey: reply.OrderingKey,
		OrderedKeysInFlight: reply.OrderedKeysInFlight, OrderedWaiting: reply.OrderedWaiting,
		OldestOrderedWait: reply.OldestOrderedWait.AsDuration(),
	}, nil
}

func newRequestID() string {
	raw := make([]byte, 16)
	if _, err := rand.Read(raw); err != nil {
		panic(err) // the system's randomness is gone: nothing sensible to do
	}
	return hex.EncodeToString(raw)
}
