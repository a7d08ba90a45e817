package lease

import (
	"context"
	"time"

	"golang.org/x/sys/unix"
)

// bootInstant is an instant on the boot clock: time since boot, suspend included. Go's
// monotonic clock and its timers use CLOCK_MONOTONIC on Linux, which stops while the machine
// is suspended; after resume a deadline measured on it would lie in the future although the
// lease may have been granted to someone else meanwhile (I6). So deadlines are kept on
// CLOCK_BOOTTIME.
type bootInstant time.Duration

// recheck is the longest a timer sleeps before reading the boot clock again, so that a
// deadline that passed during a suspend is noticed within this long of resume.
const recheck = time.Second

// bootNow reads CLOCK_BOOTTIME (CLOCK_MONOTONIC on a kernel without it, before 2.6.39).
func bootNow() bootInstant {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	}
	return bootInstant(time.Duration(ts.Nano()))
}

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
