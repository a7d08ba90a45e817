package lease

import (
	"context"
	"time"
)

// bootInstant is an instant on the boot clock: time since an arbitrary start, counting while
// the process is paused and, where the platform allows, while the machine is suspended. A
// deadline measured on a clock that stops during suspend would lie in the future after
// resume although the lease may have been granted to someone else meanwhile (I6). bootNow
// reads it; which clock that is depends on the platform:
//
//   - Linux: CLOCK_BOOTTIME (clock_linux.go). Go's own monotonic clock is CLOCK_MONOTONIC
//     there, which stops during suspend.
//   - macOS: CLOCK_MONOTONIC, which on Darwin keeps counting while the machine sleeps
//     (clock_darwin.go). Go's monotonic clock there (mach_absolute_time) does not.
//   - Windows: Go's monotonic clock, the interrupt time, which counts sleep and hibernation
//     (clock_other.go).
//   - Any other system: Go's monotonic clock (clock_other.go), which may stop while the
//     machine is suspended: there a holder resumed from a suspend longer than its margin may
//     answer Token until its next read of the lease or its renew fails. Do not suspend such
//     machines while holding.
type bootInstant time.Duration

// recheck is the longest a timer sleeps before reading the boot clock again, so that a
// deadline that passed during a suspend is noticed within this long of resume.
const recheck = time.Second

func (t bootInstant) add(d time.Duration) bootInstant { return t + bootInstant(d) }

// since is t - earlier, or zero if earlier is later.
func (t bootInstant) since(earlier bootInstant) time.Duration {
	if t <= earlier {
		return 0
	}
	return time.Duration(t - earlier)
}

// sleepUntil sleeps until deadline on the boot clock; false if ctx is done first.
func sleepUntil(ctx context.Context, deadline bootInstant) bool {
	for {
		left := deadline.since(bootNow())
		if left <= 0 {
			return true
		}
		timer := time.NewTimer(min(left, recheck))
		select {
		case <-ctx.Done():
			timer.Stop()
			return false
		case <-timer.C:
		}
	}
}
