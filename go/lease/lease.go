package lease

import (
	"context"
	"time"
)

// Lease is a granted FencedLease. It renews in the background; Token gives the fencing
// token only before the local safe deadline (send time of the last accepted renew + the
// term's duration − the margin, on CLOCK_BOOTTIME). Release deletes the claim so that the
// next waiter is granted at once; so does cancelling the context given to Acquire.
//
// A Lease is safe for concurrent use.
type Lease struct {
	k         *keeper
	stopAfter func() bool
	ctx       context.Context
}

func newLease(parent context.Context, k *keeper) *Lease {
	l := &Lease{k: k}
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(parent))
	l.ctx = ctx
	l.stopAfter = context.AfterFunc(parent, func() { k.end(Released, "its context ended") })
	context.AfterFunc(k.ctx, func() {
		l.stopAfter()
		cancel(l.Err())
	})
	return l
}

// Token is the fencing token while the lease is held: send it with every write to the
// protected resource. It checks the local safe deadline on every call, so it never answers
// past it, even when the renew goroutine could not run or the machine was suspended. Once
// the lease is not held, the error is a *LostError (errors.Is(err, ErrLost)).
func (l *Lease) Token() (int64, error) {
	now := bootNow()
	t, _ := l.k.snapshot()
	token, ok, reason, detail := t.tokenAt(now)
	if ok {
		return token, nil
	}
	l.k.checkDeadline(now)
	return 0, &LostError{Lease: l.k.namespace + "/" + l.k.lease, Token: t.state.Token, Reason: reason, Detail: detail}
}

// Held reports whether the lease is held now (see Token).
func (l *Lease) Held() bool {
	_, err := l.Token()
	return err == nil
}

// State is the hold state now. Like Token it checks the local safe deadline, so it never
// says Holding past it.
func (l *Lease) State() State {
	l.k.checkDeadline(bootNow())
	t, _ := l.k.snapshot()
	return t.state
}

// Err is nil while the lease is held, else a *LostError saying why it is not.
func (l *Lease) Err() error {
	_, err := l.Token()
	return err
}

// Done is closed when the lease is lost or released, at the latest at the local safe
// deadline (from its own timer, so also when other goroutines are starved; within a second
// of resume after a suspend).
func (l *Lease) Done() <-chan struct{} { return l.k.ctx.Done() }

// Context is cancelled when the lease is lost or released, with Err as its cause: tie the
// holder's work to it. It carries the values of the context given to Acquire.
func (l *Lease) Context() context.Context { return l.ctx }

// TimeLeft is the time before the local safe deadline (zero once the lease is not held).
// A renew moves the deadline on.
func (l *Lease) TimeLeft() time.Duration {
	now := bootNow()
	t, _ := l.k.snapshot()
	if _, ok, _, _ := t.tokenAt(now); !ok {
		return 0
	}
	return t.deadline().since(now)
}

// DeadlineIn is how far the local safe deadline of the last accepted renew is from now:
// negative once it has passed. Unlike TimeLeft it answers also after the lease was lost, so
// that a holder can report how much of its term it still had when the hold ended.
func (l *Lease) DeadlineIn() time.Duration {
	now := bootNow()
	t, _ := l.k.snapshot()
	deadline := t.deadline()
	if now >= deadline {
		return -now.since(deadline)
	}
	return deadline.since(now)
}

// Duration is the lease duration in force for this claim: the term's, fixed at grant (I10).
func (l *Lease) Duration() time.Duration { return l.k.timing().duration }

// Namespace of the lease.
func (l *Lease) Namespace() string { return l.k.namespace }

// Name of the lease.
func (l *Lease) Name() string { return l.k.lease }

// Claim is the name of this holder's FencedLeaseClaim.
func (l *Lease) Claim() string { return l.k.claim }

// Identity is the holder identity written in the claim.
func (l *Lease) Identity() string { return l.k.identity }

// Release stops acting as holder at once, then deletes the claim so that the next waiter is
// granted without waiting for expiry, and returns once that is done and every goroutine of
// this Lease has stopped (or ctx is done first: the deletion still completes); meanwhile it
// sends the refusals not yet reported (Reported). Releasing a lost lease only waits for its
// claim to be deleted; releasing twice is harmless.
func (l *Lease) Release(ctx context.Context) error {
	l.stopAfter()
	reported := make(chan struct{})
	go func() { l.Reported(ctx); close(reported) }()
	err := l.k.discard(ctx, Released)
	<-l.ctx.Done()
	<-reported
	return err
}
