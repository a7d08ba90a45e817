//go:build !linux && !darwin

package lease

import "time"

// processStart anchors bootNow: only differences of instants matter.
var processStart = time.Now()

// bootNow reads Go's monotonic clock. On Windows that is the interrupt time, which counts
// sleep and hibernation; on other systems it may stop while the machine is suspended (see
// bootInstant).
func bootNow() bootInstant { return bootInstant(time.Since(processStart)) }
