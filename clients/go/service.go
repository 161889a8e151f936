package busmq

// Request/reply through the gateway's RequestService: requesters call a service by
// name; handlers serve it from a stream that resumes after it breaks.

import (
	"context"
	"io"
	"sync"
	"time"

	pb "busmq.dev/go/gen/busmq/v1"
	"google.golang.org/protobuf/types/known/durationpb"
)

// DefaultRequestTimeout is how long a request waits for its reply when given no timeout.
const DefaultRequestTimeout = 30 * time.Second

// Service is request/reply service Name on the gateway.
type Service struct {
	client *Client
	Name   string
}

// Service returns a handle on service name.
func (c *Client) Service(name string) *Service {
	return &Service{client: c, Name: name}
}

// Reply is a reply's payload (or one item of a streamed reply).
type Reply struct {
	Payload []byte
	Kind    pb.PayloadKind
}

func (s *Service) outgoing(ctx context.Context, request Message) *pb.OutgoingMessage {
	headers := withContext(ctx, s.client.tracer, request.Headers)
	return &pb.OutgoingMessage{Payload: request.Payload, Kind: request.Kind, Headers: headers}
}

// Request sends request and waits up to timeout (0: DefaultRequestTimeout) for its whole
// reply. A handler's failure is ErrHandlerFailed (Metadata["error_type"] names it); no
// reply in time is ErrRequestTimeout. With a tracing client, the request carries ctx's
// trace context, so the handler's span is a child of the caller's.
func (s *Service) Request(ctx context.Context, request Message, timeout time.Duration) (Reply, error) {
	if timeout <= 0 {
		timeout = DefaultRequestTimeout
	}
	call := &pb.CallRequest{Service: s.Name, Request: s.outgoing(ctx, request), Timeout: durationpb.New(timeout)}
	ctx, cancel := context.WithTimeout(ctx, timeout+s.client.timeout)
	defer cancel()
	reply, err := s.client.Requests.Call(ctx, call)
	if err != nil {
		return Reply{}, asError(err)
	}
	return Reply{Payload: reply.Reply.GetPayload(), Kind: reply.Reply.GetKind()}, nil
}

// RequestStream sends request and calls each with the reply's items as they come; the
// timeout (0: DefaultRequestTimeout) applies to each item.
func (s *Service) RequestStream(ctx context.Context, request Message, timeout time.Duration, each func(Reply) error) error {
	if timeout <= 0 {
		timeout = DefaultRequestTimeout
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := s.client.Requests.CallStream(ctx, &pb.CallStreamRequest{
		Service: s.Name, Request: s.outgoing(ctx, request), Timeout: durationpb.New(timeout),
	})
	if err != nil {
		return asError(err)
	}
	return receive(stream.Recv, func(response *pb.CallStreamResponse) (bool, error) {
		if item, ok := response.Event.(*pb.CallStreamResponse_Item); ok {
			return true, each(Reply{Payload: item.Item.Payload, Kind: item.Item.Kind})
		}
		return true, nil
	})
}

// ServedRequest is a request as a handler sees it.
type ServedRequest struct {
	ID      uint64
	Payload []byte
	Kind    pb.PayloadKind
	Headers map[string]string
	// DeliveryCount above 1: a handler went away while holding it.
	DeliveryCount uint32
}

// Handler answers a request with its reply, or fails it: the requester gets
// ErrHandlerFailed with the error's text, and error_type from an error that has an
// ErrorType() string method ("Error" otherwise).
type Handler func(ctx context.Context, request ServedRequest) (Message, error)

// StreamHandler answers a request with a streamed reply: each send is one item the
// requester's RequestStream receives as it comes; returning ends the reply (an error
// fails it, as for Handler).
type StreamHandler func(ctx context.Context, request ServedRequest, send func(Message) error) error

// ServeOptions says how to serve (the zero value: the gateway's defaults).
type ServeOptions struct {
	// Concurrency is the number of requests handled at once (default 16).
	Concurrency uint32
	// VisibilityTimeout: a request unanswered this long goes to another handler.
	VisibilityTimeout time.Duration
}

// Server is a running handler of a service.
type Server struct {
	service  *Service
	handler  Handler
	streamer StreamHandler
	options  ServeOptions
	stop     context.CancelFunc
	done     chan struct{}
	running  sync.WaitGroup
	err      error
	// Resumes counts the streams reopened after a break (read after Wait).
	Resumes int
}

// Serve handles requests with handler until Stop or ctx ends, reopening its stream
// with backoff when it breaks (requests unanswered at the break come to a handler
// again). With a tracing client, each request is handled in a CONSUMER span that is a
// child of the requester's.
func (s *Service) Serve(ctx context.Context, handler Handler, options ServeOptions) *Server {
	return s.serve(ctx, &Server{handler: handler}, options)
}

// ServeStream is Serve with a handler that streams its replies item by item.
func (s *Service) ServeStream(ctx context.Context, handler StreamHandler, options ServeOptions) *Server {
	return s.serve(ctx, &Server{streamer: handler}, options)
}

func (s *Service) serve(ctx context.Context, server *Server, options ServeOptions) *Server {
	if options.Concurrency == 0 {
		options.Concurrency = 16
	}
	ctx, stop := s.client.whileOpen(ctx)
	server.service, server.options, server.stop, server.done = s, options, stop, make(chan struct{})
	go server.run(ctx)
	return server
}

// Stop stops taking requests and waits for the ones in hand to be answered.
func (s *Server) Stop() error {
	s.stop()
	return s.Wait()
}

// Wait waits until serving ends; the error is why (nil after Stop).
func (s *Server) Wait() error {
	<-s.done
	return s.err
}

func (s *Server) run(ctx context.Context) {
	defer close(s.done)
	defer s.running.Wait()
	s.err = resumeLoop(ctx, func(ctx context.Context, started func()) (bool, error) {
		return false, s.stream(ctx, started)
	}, func(error) { s.Resumes++ })
}

func (s *Server) stream(ctx context.Context, started func()) error {
	request := &pb.ServeRequest{Service: s.service.Name, Concurrency: s.options.Concurrency}
	if s.options.VisibilityTimeout > 0 {
		request.VisibilityTimeout = durationpb.New(s.options.VisibilityTimeout)
	}
	stream, err := s.service.client.Requests.Serve(ctx, request)
	if err != nil {
		return asError(err)
	}
	for {
		response, err := stream.Recv()
		if err == io.EOF {
			return nil // ended by a draining gateway: reopen
		}
		if err != nil {
			return asError(err)
		}
		switch event := response.Event.(type) {
		case *pb.ServeResponse_Started:
			started()
		case *pb.ServeResponse_Request:
			served := event.Request
			m := served.Message
			request := ServedRequest{ID: m.GetId(), Payload: m.GetPayload(), Kind: m.GetKind(),
				Headers: m.GetHeaders(), DeliveryCount: served.DeliveryCount}
			s.running.Add(1)
			go func() {
				defer s.running.Done()
				s.answer(served.RequestId, request)
			}()
		}
	}
}

func (s *Server) answer(requestID string, request ServedRequest) {
	client := s.service.client
	reply := func(answer *pb.ReplyRequest) error {
		answer.RequestId = requestID
		return client.unary(context.Background(), func(ctx context.Context) error {
			_, err := client.Requests.Reply(ctx, answer)
			return err
		})
	}
	var value Message
	handled := process(context.Background(), client.tracer, s.service.Name, request.ID, request.Headers,
		func(ctx context.Context) (err error) {
			if s.streamer == nil {
				value, err = s.handler(ctx, request)
				return err
			}
			return s.streamer(ctx, request, func(item Message) error {
				chunk := &pb.ReplyChunks{Items: []*pb.ReplyPayload{{Payload: item.Payload, Kind: item.Kind}}}
				return reply(&pb.ReplyRequest{Reply: &pb.ReplyRequest_Chunks{Chunks: chunk}})
			})
		})
	// A reply that does not arrive leaves the request to be handled again.
	switch {
	case handled != nil:
		kind := "Error"
		if typed, ok := handled.(interface{ ErrorType() string }); ok {
			kind = typed.ErrorType()
		}
		_ = reply(&pb.ReplyRequest{Reply: &pb.ReplyRequest_Error{Error: &pb.ReplyError{Type: kind, Message: handled.Error()}}})
	case s.streamer != nil:
		_ = reply(&pb.ReplyRequest{Reply: &pb.ReplyRequest_Chunks{Chunks: &pb.ReplyChunks{End: true}}})
	default:
		_ = reply(&pb.ReplyRequest{Reply: &pb.ReplyRequest_Value{Value: &pb.ReplyPayload{Payload: value.Payload, Kind: value.Kind}}})
	}
}
