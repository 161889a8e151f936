package busmq

// Without a push stream (push_stream.go): pushes made while a push call is under way go
// together in the next call (PushMany),
// with no added delay: one call at a time per client, each push still answered on its
// own (its ids, or its own error). A gateway spends about a millisecond of CPU per call
// whatever it carries, so single-message pushes at a high rate would otherwise saturate it.

import (
	"context"
	"sync"
	"sync/atomic"

	pb "busmq.dev/go/gen/busmq/v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// PushMany's bounds: at most 10,000 pushes holding at most 10,000 messages.
const (
	maxPushes   = 10000
	maxMessages = 10000
)

type pendingPush struct {
	request *pb.PushRequest
	done    chan pushResult
}

type pushResult struct {
	ids []uint64
	err error
}

type pushCoalescer struct {
	client  *Client
	mu      sync.Mutex
	waiting []*pendingPush
	sending bool
	calls   int64
}

// push stores request over the client's push stream, else (a gateway without one, or a
// large push) in the next call, and waits for its outcome (or ctx).
func (p *pushCoalescer) push(ctx context.Context, request *pb.PushRequest) ([]uint64, error) {
	if proto.Size(request) <= maxStreamedBytes {
		ids, err := p.client.stream.push(ctx, request)
		if err != errNoPushStream {
			return ids, err
		}
	}
	pending := &pendingPush{request: request, done: make(chan pushResult, 1)}
	p.mu.Lock()
	p.waiting = append(p.waiting, pending)
	start := !p.sending
	p.sending = true
	p.mu.Unlock()
	if start {
		go p.send()
	}
	select {
	case result := <-pending.done:
		return result.ids, result.err
	case <-ctx.Done():
		return nil, ctx.Err() // the push may still be stored: retry with its request id
	}
}

func (p *pushCoalescer) send() {
	for {
		p.mu.Lock()
		if len(p.waiting) == 0 {
			p.sending = false
			p.mu.Unlock()
			return
		}
		count, messages := 0, 0
		for _, pending := range p.waiting {
			size := len(pending.request.Messages)
			if count > 0 && (count == maxPushes || messages+size > maxMessages) {
				break
			}
			count, messages = count+1, messages+size
		}
		batch := p.waiting[:count:count]
		p.waiting = p.waiting[count:]
		p.mu.Unlock()
		p.call(batch)
	}
}

func (p *pushCoalescer) call(batch []*pendingPush) {
	atomic.AddInt64(&p.calls, 1)
	queues := p.client.Queues
	if len(batch) == 1 {
		var reply *pb.PushResponse
		err := p.client.unary(context.Background(), func(ctx context.Context) (err error) {
			reply, err = queues.Push(ctx, batch[0].request)
			return err
		})
		if err != nil {
			batch[0].done <- pushResult{err: err}
		} else {
			batch[0].done <- pushResult{ids: reply.Ids}
		}
		return
	}
	request := &pb.PushManyRequest{}
	for _, pending := range batch {
		request.Pushes = append(request.Pushes, pending.request)
	}
	var reply *pb.PushManyResponse
	err := p.client.unary(context.Background(), func(ctx context.Context) (err error) {
		reply, err = queues.PushMany(ctx, request)
		return err
	})
	for i, pending := range batch {
		switch {
		case err != nil:
			pending.done <- pushResult{err: err}
		case i >= len(reply.Outcomes):
			pending.done <- pushResult{err: &Error{Reason: "NO_OUTCOME", Message: "the gateway gave no outcome"}}
		case reply.Outcomes[i].GetResult() != nil:
			pending.done <- pushResult{ids: reply.Outcomes[i].GetResult().Ids}
		default: // its own status, with its ErrorInfo, as Push would have ended
			pending.done <- pushResult{err: asError(status.ErrorProto(reply.Outcomes[i].GetError()))}
		}
	}
}
