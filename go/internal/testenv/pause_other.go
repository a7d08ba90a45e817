//go:build !unix

package testenv

import (
	"os"
	"testing"
)

// Pause skips the test: pausing a process needs SIGSTOP.
func Pause(t testing.TB, _ *os.Process) {
	t.Helper()
	t.Skip("pausing a process needs SIGSTOP (unix)")
}

// Resume skips the test: see Pause.
func Resume(t testing.TB, _ *os.Process) {
	t.Helper()
	t.Skip("resuming a process needs SIGCONT (unix)")
}

// ResumeQuietly does nothing where processes cannot be paused.
func ResumeQuietly(*os.Process) {}
