package lease

import (
	"context"
	"fmt"
	"time"

	"github.com/fenced-lease/fenced-lease/go/api/v1alpha1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// Acquire waits until lease in namespace is granted to a claim of this holder and returns
// the Lease that keeps it, heartbeating in the background.
//
// The wait ends as Options.Wait says, or when ctx is done; the claim is then withdrawn and
// the error matches ErrTimeout, or ctx's error. Meanwhile API errors that may pass
// (connection refused, timeouts, 5xx, 429) are retried with jittered backoff and the claim
// keeps its place in the queue; a 403 is returned at once (ErrForbidden). A queued claim
// that the operator expires is replaced by a fresh one at the back of the queue.
//
// Once granted, the lease is held until it is lost, Release is called, or ctx is done:
// cancelling ctx releases it. Logs go to the logr.Logger in ctx, else to controller-runtime's
// (ctrl.Log, set with ctrl.SetLogger).
func Acquire(ctx context.Context, c *Client, namespace, lease string, opts Options) (*Lease, error) {
	log := Logger(ctx)
	b := newBudget(ctx, namespace+"/"+lease, opts.Wait)
	identity := opts.Identity
	if identity == "" {
		identity = DefaultIdentity()
	}
	pod := opts.Pod
	if pod == nil {
		pod = PodFromEnv(namespace)
	}
	readTimeout := opts.RequestTimeout
	if readTimeout <= 0 {
		readTimeout = 10 * time.Second
	}
	// Until the lease is read, requests are paced as for the longest lease there can be.
	req := claimRequest{client: c, log: log, namespace: namespace, lease: lease, identity: identity, pod: pod, callTimeout: readTimeout}
	// The lease is read while the first claim is created, not before: a round trip less. A
	// claim made for a lease that turns out missing, or too short for the margin, is withdrawn.
	type read struct {
		lease *v1alpha1.FencedLease
		err   error
	}
	reads := make(chan read, 1)
	go func() {
		l, err := retry(b, "get FencedLease", readTimeout, func(ctx context.Context) (*v1alpha1.FencedLease, error) {
			return c.getLease(ctx, namespace, lease)
		})
		reads <- read{l, err}
	}()
	created, firstSent, createErr := req.create(b)
	r := <-reads
	spec, err := leaseDuration(r.lease, r.err, namespace, lease, opts.Margin)
	if err != nil {
		if createErr == nil {
			req.withdraw(created.Name)
		}
		return nil, err
	}
	tm := newTiming(spec, opts.Margin, opts.RequestTimeout)
	req.callTimeout = tm.callTimeout
	leaseRead := r.lease
	for first := true; ; first = false {
		if !first {
			created, firstSent, createErr = req.create(b)
			leaseRead = nil // the lease as read is older now: the keeper reads it again
		}
		if createErr != nil {
			return nil, createErr
		}
		t := newTracker(created.Name, firstSent, spec, opts.Margin, opts.RequestTimeout)
		k := startKeeper(c, log, namespace, lease, identity, t, firstSent, created, leaseRead)
		held, again, err := waitGrant(ctx, k, b, tm.callTimeout)
		if held {
			log.Info("lease granted", "lease", namespace+"/"+lease, "claim", k.claim, "token", k.t.state.Token)
			return newLease(ctx, k), nil
		}
		if !again {
			return nil, err
		}
	}
}

// leaseDuration is the spec duration of lease l as read (with err), once it is known to
// exist and to be longer than margin.
func leaseDuration(l *v1alpha1.FencedLease, err error, namespace, lease string, margin time.Duration) (time.Duration, error) {
	if apierrors.IsNotFound(err) {
		return 0, &Error{Kind: ErrLeaseNotFound, What: "FencedLease " + namespace + "/" + lease}
	}
	if err != nil {
		return 0, err
	}
	spec := viewLease(l).specDuration
	if margin >= spec {
		return 0, &Error{Kind: ErrInvalidMargin, What: fmt.Sprintf("margin %v, lease duration %v", margin, spec)}
	}
	return spec, nil
}

// waitGrant waits until the keeper's claim is granted (held), over and worth queueing again
// (again), or the wait ends (err).
func waitGrant(ctx context.Context, k *keeper, b *budget, callTimeout time.Duration) (held, again bool, err error) {
	// Never give up before the operator has answered the claim once (or one request timeout
	// has passed): that is what makes NoWait "take it if it is free".
	answerBy := time.Now().Add(callTimeout)
	for {
		t, changed := k.snapshot()
		switch t.state.Phase {
		case Holding:
			return true, false, nil
		case Lost:
			cleanup(k, t.state.Reason)
			if t.state.Token == 0 && (t.state.Reason.stall() || t.state.Reason == Superseded) {
				k.log.Info("queued claim is over; queueing a fresh one", "reason", t.state.Reason.String())
				if b.over() {
					return false, false, b.timedOut()
				}
				return false, true, nil
			}
			return false, false, lostWhileWaiting(k, t.state)
		}
		giveUp := b.giveUp
		if !t.answered() && !giveUp.IsZero() && giveUp.Before(answerBy) {
			giveUp = answerBy
		}
		switch waitUntil(ctx, changed, giveUp) {
		case woken:
		case wokeAtDeadline:
			cleanup(k, Released)
			return false, false, b.timedOut()
		case wokeCancelled:
			cleanup(k, Released)
			return false, false, b.cancelled()
		}
	}
}

type wake int

const (
	woken wake = iota
	wokeAtDeadline
	wokeCancelled
)

// waitUntil waits for changed, the instant at (none if zero), or ctx.
func waitUntil(ctx context.Context, changed <-chan struct{}, at time.Time) wake {
	var expired <-chan time.Time
	if !at.IsZero() {
		timer := time.NewTimer(time.Until(at))
		defer timer.Stop()
		expired = timer.C
	}
	select {
	case <-changed:
		return woken
	case <-expired:
		return wokeAtDeadline
	case <-ctx.Done():
		return wokeCancelled
	}
}

// cleanup withdraws a claim; if that fails the claim expires on its own (no heartbeats).
func cleanup(k *keeper, reason LostReason) {
	ctx, cancel := context.WithTimeout(context.Background(), k.timing().callTimeout+time.Second)
	defer cancel()
	_ = k.discard(ctx, reason)
}

func lostWhileWaiting(k *keeper, s State) error {
	what := "FencedLease " + k.namespace + "/" + k.lease
	switch s.Reason {
	case LeaseDeleted:
		return &Error{Kind: ErrLeaseNotFound, What: what}
	case Forbidden:
		return &Error{Kind: ErrForbidden, What: "renew FencedLeaseClaim " + k.claim, Err: fmt.Errorf("%s", s.Detail)}
	case MarginTooLarge:
		return &Error{Kind: ErrInvalidMargin, What: s.Detail}
	}
	return &LostError{Lease: k.namespace + "/" + k.lease, Token: s.Token, Reason: s.Reason, Detail: s.Detail}
}
