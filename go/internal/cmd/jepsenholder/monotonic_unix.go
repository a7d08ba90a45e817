//go:build unix

package main

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// monotonic is nanoseconds on CLOCK_MONOTONIC: the clock every process of the run stamps
// its history with, so that the checker can merge them.
func monotonic() uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(fmt.Sprintf("CLOCK_MONOTONIC: %v", err))
	}
	return uint64(ts.Nano())
}
