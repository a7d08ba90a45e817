//go:build !unix

package main

// monotonic panics: the safety suite merges histories stamped by several processes on
// CLOCK_MONOTONIC, which only unix systems share between processes.
func monotonic() uint64 {
	panic("the safety suite's holder runs on unix only: its history needs CLOCK_MONOTONIC")
}
