package busmq

import (
	"context"
	"errors"
	"math/rand"
	"time"
)

const (
	firstBackoff = 100 * time.Millisecond
	maxBackoff   = 5 * time.Second
)

// resumeLoop runs attempt (one stream) again and again, until attempt says the work is
// done, ctx ends, or a stream fails in a way a new one would not fix (that error is
// returned). Between attempts it calls resumed with the error that broke the stream
// (nil: the gateway ended it, as a draining one does) and waits with jittered
// exponential backoff, 100 ms doubling to 5 s; attempt calls started once its stream is
// up, which resets the backoff. A stream that was up and that its gateway ended (a drain)
// is reopened at once, on another gateway: a draining one refuses new streams, so this
// cannot spin. Consumers, servers and channel ends all resume so.
func resumeLoop(ctx context.Context, attempt func(ctx context.Context, started func()) (done bool, err error),
	resumed func(err error)) error {
	backoff := firstBackoff
	for ctx.Err() == nil {
		up := false
		done, err := attempt(ctx, func() { backoff, up = firstBackoff, true })
		if done || ctx.Err() != nil {
			return nil
		}
		var busError *Error
		if err != nil && (!errors.As(err, &busError) || !streamResumable(busError)) {
			return err
		}
		resumed(err)
		if err == nil && up {
			continue // moved by a drain
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff/2 + time.Duration(rand.Int63n(int64(backoff)))):
		}
		if backoff < maxBackoff {
			backoff *= 2
		}
	}
	return nil
}
