package lock

import (
	"fmt"
	"time"

	"github.com/fenced-lease/fenced-lease/go/lease"
	"k8s.io/client-go/tools/leaderelection"
)

// Timing is the elector's pacing: client-go's LeaderElectionConfig fields, and
// controller-runtime's manager.Options of the same names.
type Timing struct {
	// LeaseDuration is how long the elector trusts a record it has seen unchanged. With this
	// lock it only paces the elector: the operator expires holders. Set to the FencedLease's
	// duration.
	LeaseDuration time.Duration
	// RenewDeadline is how long the leading elector retries a failed renew before it stops
	// leading.
	RenewDeadline time.Duration
	// RetryPeriod is the pause between the elector's attempts.
	RetryPeriod time.Duration
}

// Room is the time a term of duration d renewed on schedule has left before its local safe
// deadline just before each renew: d − d/3 (the renew period) − margin (0: the lease
// package's default). RenewDeadline + 2 × RetryPeriod must be shorter.
func Room(d, margin time.Duration) time.Duration {
	if margin <= 0 {
		margin = lease.DefaultMargin(d)
	}
	return d - max(d/3, 50*time.Millisecond) - margin
}

// DefaultTiming is the timing for a FencedLease of duration d: LeaseDuration d, and
// RenewDeadline and RetryPeriod taking half the Room (3/8 and 1/8 of it), the other half
// left for renews that arrive late.
func DefaultTiming(d, margin time.Duration) Timing {
	room := Room(d, margin)
	return Timing{LeaseDuration: d, RenewDeadline: room * 3 / 8, RetryPeriod: room / 8}
}

// Check refuses a timing that would let the elector believe it leads past the local safe
// deadline of a term renewed on schedule (RenewDeadline + 2 × RetryPeriod not below the
// Room), or that client-go's elector refuses.
func (t Timing) Check(d, margin time.Duration) error {
	room := Room(d, margin)
	switch {
	case t.RetryPeriod <= 0 || t.RenewDeadline <= 0 || t.LeaseDuration <= 0:
		return fmt.Errorf("lock: LeaseDuration, RenewDeadline and RetryPeriod must be positive (%+v)", t)
	case room <= 0:
		return fmt.Errorf("lock: a FencedLease of %v with margin %v leaves no time to lead: lengthen the lease", d, margin)
	case t.window() >= room:
		return fmt.Errorf("lock: RenewDeadline %v + 2 × RetryPeriod %v must be below %v for a FencedLease of %v (duration − renew period − margin), or the elector could believe it leads past the local safe deadline; DefaultTiming gives %+v",
			t.RenewDeadline, t.RetryPeriod, room, d, DefaultTiming(d, margin))
	case t.LeaseDuration <= t.RenewDeadline:
		return fmt.Errorf("lock: LeaseDuration %v must be longer than RenewDeadline %v", t.LeaseDuration, t.RenewDeadline)
	case float64(t.RenewDeadline) <= leaderelection.JitterFactor*float64(t.RetryPeriod):
		return fmt.Errorf("lock: RenewDeadline %v must be longer than %v × RetryPeriod %v", t.RenewDeadline, leaderelection.JitterFactor, t.RetryPeriod)
	}
	return nil
}

// window is how long after its last successful Update an elector may still believe it
// leads (RetryPeriod + RenewDeadline), plus one RetryPeriod for its scheduling and calls.
// It is the one rule for three things: Update needs more than this before the local safe
// deadline; the lock waits this long after a term before it queues again; and it releases a
// held term the elector has not renewed for this long.
func (t Timing) window() time.Duration { return t.RenewDeadline + 2*t.RetryPeriod }

// mayRenew is the rule of Update: a term with left before its local safe deadline may be
// renewed only if the elector's belief ends before the deadline.
func (t Timing) mayRenew(left time.Duration) bool { return left > t.window() }
