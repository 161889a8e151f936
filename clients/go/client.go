// Package busmq is a Go client of the busmq gRPC gateway: the code generated from proto/
// (package gen/busmq/v1) plus a thin layer for what every user would otherwise write by
// hand: the bearer secret and TLS, a deadline on every unary call, queue leases renewed
// in the background, idempotent pushes retried safely, consumers that resume after a
// broken stream, batched acks, and errors typed from google.rpc.ErrorInfo.
package busmq

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	pb "busmq.dev/go/gen/busmq/v1"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// Options says how to reach a gateway.
type Options struct {
	// Address is the gateway's host:port.
	Address string
	// Secret is the gateway's shared secret, sent as "authorization: Bearer <secret>".
	Secret string
	// TLS configures TLS (RootCAs for a private CA, Certificates for mTLS); nil means
	// plaintext, which is refused for a host that is not loopback unless AllowPlaintext.
	TLS *tls.Config
	// AllowPlaintext accepts plaintext to a host that is not loopback: the secret then
	// crosses the network in cleartext, so only behind a TLS-terminating proxy.
	AllowPlaintext bool
	// Timeout is the deadline of every unary call (default 10 s).
	Timeout time.Duration
	// Tracer turns on OpenTelemetry propagation (nil: off): pushes run in PRODUCER spans
	// and write their context into the messages' W3C traceparent/tracestate headers, and
	// Delivery.Traced runs a handling in a CONSUMER span under the message's context.
	Tracer trace.Tracer
}

// Client is a connection to one gateway. Close it to release its attachments.
type Client struct {
	conn    *grpc.ClientConn
	timeout time.Duration
	// The generated service clients, for calls the helpers do not cover.
	Queues       pb.QueueServiceClient
	Requests     pb.RequestServiceClient
	Channels     pb.ChannelServiceClient
	Persistables pb.PersistableServiceClient
	pushes       *pushCoalescer
	stream       *pushStream
	tracer       trace.Tracer
	closed       chan struct{}
	closeOnce    sync.Once
}

// Dial connects to the gateway (lazily: the first call opens the connection).
func Dial(ctx context.Context, options Options) (*Client, error) {
	dialOptions := []grpc.DialOption{grpc.WithChainUnaryInterceptor(retrySafeCalls)}
	if options.TLS != nil {
		dialOptions = append(dialOptions, grpc.WithTransportCredentials(credentials.NewTLS(options.TLS)))
	} else {
		host, _, err := net.SplitHostPort(options.Address)
		if err != nil {
			return nil, fmt.Errorf("busmq: address %q: %w", options.Address, err)
		}
		if !isLoopback(host) && !options.AllowPlaintext {
			return nil, fmt.Errorf("busmq: refusing plaintext to %s, which is not loopback: "+
				"the secret would cross the network in cleartext; set TLS, or AllowPlaintext "+
				"if a TLS-terminating proxy encrypts the hop", options.Address)
		}
		dialOptions = append(dialOptions, grpc.WithInsecure())
	}
	if options.Secret != "" {
		dialOptions = append(dialOptions, grpc.WithPerRPCCredentials(bearer{options.Secret, options.TLS != nil}))
	}
	conn, err := grpc.DialContext(ctx, options.Address, dialOptions...)
	if err != nil {
		return nil, asError(err)
	}
	timeout := options.Timeout
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	client := &Client{conn: conn, timeout: timeout, tracer: options.Tracer, closed: make(chan struct{}),
		Queues: pb.NewQueueServiceClient(conn), Requests: pb.NewRequestServiceClient(conn),
		Channels: pb.NewChannelServiceClient(conn), Persistables: pb.NewPersistableServiceClient(conn)}
	client.pushes = &pushCoalescer{client: client}
	client.stream = &pushStream{client: client}
	return client, nil
}

// Close stops every consumer, server, channel end and renewal started through the
// client, and closes the connection (release queues with Detach first).
func (c *Client) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	c.stream.close()
	return c.conn.Close()
}

// whileOpen is ctx, also cancelled once the client closes: the loops that resume streams
// or renew leases end with the client instead of retrying a closed connection for ever.
func (c *Client) whileOpen(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-c.closed:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// PushCalls counts the push calls made (Push or PushMany): pushes that do not go over
// the push stream, and made while one is under way, share the next.
func (c *Client) PushCalls() int64 {
	return atomic.LoadInt64(&c.pushes.calls)
}

// PushStreams counts the PushStream calls opened: one carries every push until it ends.
func (c *Client) PushStreams() int64 {
	return atomic.LoadInt64(&c.stream.opened)
}

// unary runs one call with the client's deadline, translating its error.
func (c *Client) unary(ctx context.Context, call func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	return asError(call(ctx))
}

type bearer struct {
	secret string
	tls    bool
}

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.secret}, nil
}

func (b bearer) RequireTransportSecurity() bool { return b.tls }

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
