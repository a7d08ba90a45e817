package lease

import (
	"time"

	"golang.org/x/sys/unix"
)

// bootNow reads CLOCK_MONOTONIC, which on Darwin keeps counting while the machine sleeps
// (unlike CLOCK_UPTIME_RAW and Go's own monotonic clock).
func bootNow() bootInstant {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return bootInstant(time.Since(processStart))
	}
	return bootInstant(time.Duration(ts.Nano()))
}

// processStart anchors the fallback if clock_gettime fails (it does not on macOS 10.12+).
var processStart = time.Now()
