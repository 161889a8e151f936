package busmq

// Pushes go over one long-lived PushStream per client: a stream message costs the
// gateway about half a unary call, and no push waits for another's call. Each push is
// answered by its sequence with its ids or its own error. A stream that ends leaves its
// unanswered pushes UNAVAILABLE (PushBatch retries them with their request ids, which
// the gateway stores once) and the next push opens another; a push unanswered within
// the client's timeout fails DEADLINE_EXCEEDED and ends the stream. A gateway without
// PushStream (UNIMPLEMENTED) gets calls (pushCoalescer) from then on.

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	pb "busmq.dev/go/gen/busmq/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Pushes larger than this go by calls: one over the gateway's gRPC message limit would
// end the whole stream, where a call fails alone.
const maxStreamedBytes = 1024 * 1024

var errNoPushStream = errors.New("busmq: the gateway has no PushStream")

type pushStream struct {
	client      *Client
	mu          sync.Mutex
	current     *openPushStream
	unsupported atomic.Bool
	opened      int64
}

type openPushStream struct {
	stream  pb.QueueService_PushStreamClient
	cancel  context.CancelFunc
	send    sync.Mutex // grpc-go's SendMsg is not safe for concurrent use
	mu      sync.Mutex
	next    uint64
	waiting map[uint64]chan pushResult
	ended   error
}

// push stores request over the stream; errNoPushStream if the gateway has none.
func (p *pushStream) push(ctx context.Context, request *pb.PushRequest) ([]uint64, error) {
	s, err := p.open()
	if err != nil {
		return nil, err
	}
	done := make(chan pushResult, 1)
	s.mu.Lock()
	if s.ended != nil {
		s.mu.Unlock()
		return nil, s.ended
	}
	s.next++
	sequence := s.next
	s.waiting[sequence] = done
	s.mu.Unlock()
	s.send.Lock()
	// A failed Send means the stream ended: the receiver answers every waiting push.
	_ = s.stream.Send(&pb.PushStreamRequest{Sequence: sequence, Push: request})
	s.send.Unlock()
	timer := time.NewTimer(p.client.timeout)
	defer timer.Stop()
	select {
	case result := <-done:
		return result.ids, result.err
	case <-timer.C:
		late := &Error{Code: codes.DeadlineExceeded, Reason: "DEADLINE_EXCEEDED",
			Message: "no answer on the push stream in time"}
		p.end(s, late)
		return nil, late
	case <-ctx.Done():
		s.mu.Lock()
		delete(s.waiting, sequence)
		s.mu.Unlock()
		return nil, ctx.Err() // the push may still be stored: retry with its request id
	}
}

func (p *pushStream) open() (*openPushStream, error) {
	if p.unsupported.Load() {
		return nil, errNoPushStream
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if s := p.current; s != nil {
		s.mu.Lock()
		ended := s.ended
		s.mu.Unlock()
		if ended == nil {
			return s, nil
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := p.client.Queues.PushStream(ctx)
	if err != nil {
		cancel()
		return nil, asError(err)
	}
	s := &openPushStream{stream: stream, cancel: cancel, waiting: map[uint64]chan pushResult{}}
	p.current = s
	atomic.AddInt64(&p.opened, 1)
	go p.receive(s)
	return s, nil
}

func (p *pushStream) receive(s *openPushStream) {
	for {
		response, err := s.stream.Recv()
		if err != nil {
			p.ended(s, err)
			return
		}
		s.mu.Lock()
		for _, outcome := range response.Outcomes {
			done, ok := s.waiting[outcome.Sequence]
			if !ok {
				continue // its pusher gave up
			}
			delete(s.waiting, outcome.Sequence)
			if result := outcome.GetResult(); result != nil {
				done <- pushResult{ids: result.Ids}
			} else { // its own status, with its ErrorInfo, as Push would have ended
				done <- pushResult{err: asError(status.ErrorProto(outcome.GetError()))}
			}
		}
		s.mu.Unlock()
	}
}

// ended maps how the stream ended for the pushes it did not answer.
func (p *pushStream) ended(s *openPushStream, err error) {
	if status.Code(err) == codes.Unimplemented {
		p.unsupported.Store(true)
		p.end(s, errNoPushStream)
		return
	}
	if st, ok := status.FromError(err); ok && st.Code() == codes.Unauthenticated {
		p.end(s, asError(err))
		return
	}
	message := "the push stream ended"
	if err != io.EOF {
		message += ": " + err.Error()
	}
	p.end(s, &Error{Code: codes.Unavailable, Reason: "STREAM_ENDED", Message: message})
}

// end ends s: every push still waiting on it fails with err.
func (p *pushStream) end(s *openPushStream, err error) {
	s.mu.Lock()
	if s.ended == nil {
		s.ended = err
	}
	waiting := s.waiting
	s.waiting = map[uint64]chan pushResult{}
	s.mu.Unlock()
	for _, done := range waiting {
		done <- pushResult{err: err}
	}
	s.cancel()
}

func (p *pushStream) close() {
	p.mu.Lock()
	s := p.current
	p.current = nil
	p.mu.Unlock()
	if s != nil {
		p.end(s, &Error{Code: codes.Canceled, Reason: "CLOSED", Message: "the client is closed"})
	}
}
