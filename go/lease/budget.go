package lease

import (
	"context"
	"fmt"
	"time"

	"github.com/fenced-lease/fenced-lease/go/internal/backoff"
)

// maxPause is the longest pause between retries while waiting.
const maxPause = 5 * time.Second

// waitBackoff paces retries while waiting: 200 ms doubling to 5 s, jittered so that a fleet
// does not stampede a recovering apiserver.
var waitBackoff = backoff.Backoff{Base: 200 * time.Millisecond, Cap: maxPause}

// budget is how long one Acquire may keep trying.
type budget struct {
	ctx     context.Context
	lease   string
	started time.Time
	giveUp  time.Time // zero: until ctx is done
	once    bool      // NoWait: one try, no retries
}

func newBudget(ctx context.Context, lease string, wait time.Duration) *budget {
	b := &budget{ctx: ctx, lease: lease, started: time.Now(), once: wait < 0}
	switch {
	case wait > 0:
		b.giveUp = b.started.Add(wait)
	case wait < 0:
		b.giveUp = b.started // still waits for the operator's first answer
	}
	return b
}

func (b *budget) timedOut() error {
	return &Error{Kind: ErrTimeout, What: fmt.Sprintf("FencedLease %s: waited %v", b.lease, time.Since(b.started).Round(time.Millisecond))}
}

func (b *budget) cancelled() error {
	return fmt.Errorf("waiting for FencedLease %s: %w", b.lease, context.Cause(b.ctx))
}

func (b *budget) over() bool { return !b.giveUp.IsZero() && !time.Now().Before(b.giveUp) }

// call makes one API call with a timeout; the caller's cancellation is returned as such.
func call[T any](b *budget, what string, timeout time.Duration, f func(context.Context) (T, error)) (T, error) {
	ctx, cancel := context.WithTimeout(b.ctx, timeout)
	defer cancel()
	v, err := f(ctx)
	switch {
	case err == nil:
		return v, nil
	case b.ctx.Err() != nil:
		return v, b.cancelled()
	case ctx.Err() != nil:
		return v, timedOut(what, timeout)
	}
	return v, fromAPI(what, err)
}

// pause waits before retry attempt after err; returns err itself when it is not worth
// retrying or the wait would end first, or the caller's cancellation.
func (b *budget) pause(attempt int, err error) error {
	if b.once || !retryable(err) {
		return err
	}
	d := max(waitBackoff.Pause(attempt, randFloat()), min(retryAfter(err), maxPause))
	if !b.giveUp.IsZero() && time.Now().Add(d).After(b.giveUp) {
		return err
	}
	if !backoff.Sleep(b.ctx, d) {
		return b.cancelled()
	}
	return nil
}

// retry calls until an answer, retrying transient failures within the wait.
func retry[T any](b *budget, what string, timeout time.Duration, f func(context.Context) (T, error)) (T, error) {
	for attempt := 1; ; attempt++ {
		v, err := call(b, what, timeout, f)
		if err == nil {
			return v, nil
		}
		if perr := b.pause(attempt, err); perr != nil {
			return v, perr
		}
	}
}
