package busmq

// Channel ends through the gateway's ChannelService: two ends exchange messages both
// ways, each end's stream resuming after it breaks.

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	pb "busmq.dev/go/gen/busmq/v1"
	"google.golang.org/protobuf/types/known/durationpb"
)

// ChannelRoles names the role an end plays and its peer's (default "local" and
// "remote").
type ChannelRoles struct {
	Local, Remote string
}

// ChannelEvent is a state event: "connected", "remote_connected",
// "remote_disconnected", "disconnected", "ended", "draining", or this client's
// "resuming" (the stream broke and is being reopened), with its details.
type ChannelEvent struct {
	Kind    string
	Details map[string]string
}

// ChannelOptions says how to connect (the zero value: at-most-once, gateway defaults).
type ChannelOptions struct {
	// Listen plays the remote role (the roles swapped), as the other end of a Connect.
	Listen bool
	Mode   pb.ConsumeMode
	// Prefetch bounds the read-ahead (0: the gateway's default).
	Prefetch uint32
	// VisibilityTimeout: at-least-once messages unacked this long come again.
	VisibilityTimeout time.Duration
	// TTL is how long the channel's queues survive with no end attached.
	TTL time.Duration
	// OnEvent is called with each state event, on the end's goroutine (keep it short).
	OnEvent func(ChannelEvent)
}

// ChannelMessage is a message this end received.
type ChannelMessage struct {
	ID            uint64
	Payload       []byte
	Kind          pb.PayloadKind
	Headers       map[string]string
	DeliveryCount uint32
	end           *ChannelEnd
	role          string
}

// Ack acknowledges an at-least-once message (a no-op in the other modes).
func (m ChannelMessage) Ack(ctx context.Context) error {
	end := m.end
	if end.options.Mode != pb.ConsumeMode_CONSUME_MODE_AT_LEAST_ONCE {
		return nil
	}
	return end.client.unary(ctx, func(ctx context.Context) error {
		_, err := end.client.Channels.AckChannel(ctx, &pb.AckChannelRequest{Channel: end.Name, Role: m.role, Ids: []uint64{m.ID}})
		return err
	})
}

// Traced runs handle in a CONSUMER span whose parent is the context the message
// carries, when the client traces; else it just runs handle.
func (m ChannelMessage) Traced(ctx context.Context, handle func(context.Context) error) error {
	return process(ctx, m.end.client.tracer, m.end.Name, m.ID, m.Headers, handle)
}

// ChannelEnd is one end of channel Name. Connect it, read Messages, Send to the peer.
type ChannelEnd struct {
	client *Client
	Name   string
	Roles  ChannelRoles

	options  ChannelOptions
	messages chan ChannelMessage
	stop     context.CancelFunc
	done     chan struct{}
	err      error

	mu           sync.Mutex
	connectionID string
	role, peer   string
	closing      bool
	// Resumes counts the streams reopened after a break (read after Messages closed).
	Resumes int
}

// Channel returns one end of channel name playing roles.Local towards roles.Remote.
func (c *Client) Channel(name string, roles ChannelRoles) *ChannelEnd {
	return &ChannelEnd{client: c, Name: name, Roles: roles}
}

// Connect connects this end and returns once the gateway has. From then on the end
// resumes by itself when its stream breaks (a gateway restart or drain, a cut): it
// reports "resuming", reconnects with backoff and keeps delivering; at-least-once
// messages not acked before the break come back.
func (e *ChannelEnd) Connect(ctx context.Context, options ChannelOptions) error {
	e.options = options
	e.messages = make(chan ChannelMessage)
	e.done = make(chan struct{})
	runCtx, stop := e.client.whileOpen(context.Background())
	e.stop = stop
	stream, err := e.open(ctx, runCtx)
	if err != nil {
		stop()
		close(e.messages)
		close(e.done)
		return err
	}
	go e.run(runCtx, stream)
	return nil
}

// Role is the role this end plays once connected; PeerRole its peer's.
func (e *ChannelEnd) Role() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.role
}

// PeerRole is the role of the other end.
func (e *ChannelEnd) PeerRole() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.peer
}

// Messages is closed when the end stops: the channel ended, Close, or an error that is
// not a broken stream (see Err).
func (e *ChannelEnd) Messages() <-chan ChannelMessage { return e.messages }

// Err is why the end stopped (nil when the channel ended or it was closed).
func (e *ChannelEnd) Err() error {
	<-e.done
	return e.err
}

type channelStream = pb.ChannelService_ConnectChannelClient

// open starts a stream (in runCtx, waiting for its start within ctx).
func (e *ChannelEnd) open(ctx, runCtx context.Context) (channelStream, error) {
	request := &pb.ConnectChannelRequest{
		Channel: e.Name, LocalRole: e.Roles.Local, RemoteRole: e.Roles.Remote,
		Listen: e.options.Listen, Mode: e.options.Mode, Prefetch: e.options.Prefetch,
	}
	if e.options.VisibilityTimeout > 0 {
		request.VisibilityTimeout = durationpb.New(e.options.VisibilityTimeout)
	}
	if e.options.TTL > 0 {
		request.Ttl = durationpb.New(e.options.TTL)
	}
	stream, err := e.client.Channels.ConnectChannel(runCtx, request)
	if err != nil {
		return nil, asError(err)
	}
	started := make(chan error, 1)
	var first *pb.ConnectChannelResponse
	go func() {
		var err error
		first, err = stream.Recv()
		started <- err
	}()
	select {
	case err = <-started:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if err != nil {
		return nil, asError(err)
	}
	start, ok := first.Event.(*pb.ConnectChannelResponse_Started)
	if !ok {
		return nil, fmt.Errorf("busmq: channel %s: the stream did not start", e.Name)
	}
	e.mu.Lock()
	e.connectionID, e.role, e.peer = start.Started.ConnectionId, start.Started.Role, start.Started.PeerRole
	e.mu.Unlock()
	return stream, nil
}

func (e *ChannelEnd) run(ctx context.Context, stream channelStream) {
	defer close(e.done)
	defer close(e.messages)
	e.err = resumeLoop(ctx, func(ctx context.Context, started func()) (bool, error) {
		if stream == nil {
			var err error
			if stream, err = e.open(ctx, ctx); err != nil {
				return e.isClosing(), err
			}
		}
		started()
		ended, err := e.pump(ctx, stream)
		stream = nil // the next attempt reconnects
		return ended || e.isClosing(), err
	}, func(err error) {
		e.Resumes++
		reason := "stream ended"
		if err != nil {
			reason = err.Error()
		}
		e.event(ChannelEvent{Kind: "resuming", Details: map[string]string{"error": reason}})
	})
}

func (e *ChannelEnd) isClosing() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.closing
}

// pump delivers one stream's messages; ended says the channel ended.
func (e *ChannelEnd) pump(ctx context.Context, stream channelStream) (ended bool, err error) {
	role := e.Role()
	for {
		response, err := stream.Recv()
		if err == io.EOF {
			return false, nil
		}
		if err != nil {
			return false, asError(err)
		}
		switch event := response.Event.(type) {
		case *pb.ConnectChannelResponse_Delivery:
			m := event.Delivery.Message
			message := ChannelMessage{ID: m.GetId(), Payload: m.GetPayload(), Kind: m.GetKind(), Headers: m.GetHeaders(),
				DeliveryCount: event.Delivery.DeliveryCount, end: e, role: role}
			select {
			case e.messages <- message:
			case <-ctx.Done():
				return false, nil
			}
		case *pb.ConnectChannelResponse_State:
			e.event(ChannelEvent{Kind: event.State.Kind, Details: event.State.Details})
			if event.State.Kind == "ended" {
				return true, nil
			}
		}
	}
}

func (e *ChannelEnd) event(event ChannelEvent) {
	if e.options.OnEvent != nil {
		e.options.OnEvent(event)
	}
}

// Send sends message to the peer and returns its id in the peer's queue. With a
// tracing client it runs in a PRODUCER span whose context the message carries. A Send
// made while the end reconnects fails with the gateway's error: retry it.
func (e *ChannelEnd) Send(ctx context.Context, message Message) (uint64, error) {
	ids, err := e.send(ctx, []Message{message})
	if err != nil {
		return 0, err
	}
	return ids[0], nil
}

func (e *ChannelEnd) send(ctx context.Context, messages []Message) ([]uint64, error) {
	// The tracing of a push, with this channel's name as the destination.
	carrierQueue := &Queue{client: e.client, Name: e.Name}
	return carrierQueue.send(ctx, messages, func(ctx context.Context, messages []Message) ([]uint64, error) {
		request := &pb.SendChannelRequest{ConnectionId: e.connection(), RequestId: newRequestID()}
		for _, m := range messages {
			request.Messages = append(request.Messages, &pb.OutgoingMessage{Payload: m.Payload, Kind: m.Kind, Headers: m.Headers})
		}
		var reply *pb.SendChannelResponse
		err := e.client.unary(ctx, func(ctx context.Context) (err error) {
			reply, err = e.client.Channels.SendChannel(ctx, request)
			return err
		})
		if err != nil {
			return nil, err
		}
		return reply.Ids, nil
	})
}

func (e *ChannelEnd) connection() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.connectionID
}

// Disconnect disconnects this end (messages keep waiting in its queue for the next
// Connect) and stops it.
func (e *ChannelEnd) Disconnect(ctx context.Context) error {
	return e.finish(ctx, func(ctx context.Context, id string) error {
		_, err := e.client.Channels.DisconnectChannel(ctx, &pb.DisconnectChannelRequest{ConnectionId: id})
		return err
	})
}

// End ends the channel for both ends and removes its queues.
func (e *ChannelEnd) End(ctx context.Context) error {
	return e.finish(ctx, func(ctx context.Context, id string) error {
		_, err := e.client.Channels.EndChannel(ctx, &pb.EndChannelRequest{ConnectionId: id})
		return err
	})
}

func (e *ChannelEnd) finish(ctx context.Context, call func(context.Context, string) error) error {
	e.mu.Lock()
	e.closing = true
	e.mu.Unlock()
	id := e.connection()
	err := e.client.unary(ctx, func(ctx context.Context) error { return call(ctx, id) })
	e.Close()
	return err
}

// Close stops this end's stream without telling the gateway anything more.
func (e *ChannelEnd) Close() {
	if e.stop != nil {
		e.stop()
	}
}
