package busmq

import (
	"context"
	"math/rand"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// safeToRetry are the calls that are safe to repeat, retried on another gateway when one
// fails Unavailable (or is cancelled by the gateway's side). Behind a balancer, a gateway
// that dies or drains fails the calls in flight on it (a reset stream, a 502 from the
// balancer). These only renew, settle, read
// or release, so the client repeats them itself with jittered exponential backoff; each
// attempt is a new call the balancer may send to another gateway. Attaches, pushes
// without a request id and replies are not repeated here: the caller knows whether it
// may. The list is the Python federation's (busmq.federation.retries) and the TypeScript
// client's.
var safeToRetry = map[string]bool{
	"/busmq.v1.QueueService/RenewAttachment":        true,
	"/busmq.v1.QueueService/DetachQueue":            true,
	"/busmq.v1.QueueService/Ack":                    true,
	"/busmq.v1.QueueService/Nack":                   true,
	"/busmq.v1.QueueService/Reject":                 true,
	"/busmq.v1.QueueService/GetQueue":               true,
	"/busmq.v1.QueueService/ListQueues":             true,
	"/busmq.v1.ChannelService/AckChannel":           true,
	"/busmq.v1.PersistableService/LoadPersistable":  true,
	"/busmq.v1.PersistableService/RenewPersistable": true,
}

const (
	retryAttempts = 5
	retryInitial  = 50 * time.Millisecond
	retryMax      = time.Second
)

// retrySafeCalls is a unary interceptor (grpc-go's own retry policy is off by default in
// the versions Debian ships) that repeats the calls of safeToRetry on Unavailable.
func retrySafeCalls(ctx context.Context, method string, req, reply interface{},
	cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if !safeToRetry[method] {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	backoff := retryInitial
	for attempt := 1; ; attempt++ {
		err := invoker(ctx, method, req, reply, cc, opts...)
		// Cancelled by the other side, not by us: a balancer resets a call when the
		// gateway behind it goes away.
		code := status.Code(err)
		retryable := code == codes.Unavailable || (code == codes.Canceled && ctx.Err() == nil)
		if err == nil || !retryable || attempt >= retryAttempts {
			return err
		}
		jittered := time.Duration(float64(backoff) * (0.8 + 0.4*rand.Float64())) // +-20%, as gRPC
		select {
		case <-ctx.Done():
			return err
		case <-time.After(jittered):
		}
		if backoff *= 2; backoff > retryMax {
			backoff = retryMax
		}
	}
}
