// Package backoff is the one retry pause of the Go module: exponential from a base, capped,
// scaled by an equal jitter in [0.5, 1) so that a fleet does not retry in step, and a sleep
// that a context cuts short.
//
// It is not apimachinery's wait.Backoff: that one is stateful (Step mutates it, so each
// retry loop needs its own copy), draws its jitter from a random source it does not let the
// caller choose, and jitters upwards (d to d×(1+j)) rather than within [d/2, d). Pause is a
// pure function of the attempt and the jitter, which keeps the pauses unit-testable with a
// fixed jitter.
package backoff

import (
	"context"
	"math"
	"time"
)

// Backoff is an exponential pause: Base before the first retry, doubling per attempt, never
// more than Cap.
type Backoff struct {
	// Base is the full pause before retry attempt 1; must be positive.
	Base time.Duration
	// Cap bounds the full pause; must be at least Base.
	Cap time.Duration
}

// Pause is the pause before retry attempt (1-based; lower counts as 1): Base doubled
// attempt-1 times, at most Cap, scaled by 0.5+0.5×jitter, jitter in [0, 1] (clamped), e.g.
// rand.Float64(). Large attempts do not overflow.
func (b Backoff) Pause(attempt int, jitter float64) time.Duration {
	full := b.Base
	for n := 1; n < attempt && full > 0 && full < b.Cap; n++ {
		if full > b.Cap/2 {
			full = b.Cap
		} else {
			full *= 2
		}
	}
	full = min(full, b.Cap)
	d := float64(full) * (0.5 + 0.5*min(max(jitter, 0), 1))
	if d >= math.MaxInt64 { // full itself near the largest Duration, rounded up as a float
		return full
	}
	return time.Duration(d)
}

// Sleep waits d; false if ctx is done first.
func Sleep(ctx context.Context, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}
