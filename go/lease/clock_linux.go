package lease

import (
	"time"

	"golang.org/x/sys/unix"
)

// bootNow reads CLOCK_BOOTTIME, which counts suspend (CLOCK_MONOTONIC on a kernel without
// it, before 2.6.39).
func bootNow() bootInstant {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	}
	return bootInstant(time.Duration(ts.Nano()))
}
