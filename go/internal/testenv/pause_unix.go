//go:build unix

package testenv

import (
	"os"
	"syscall"
	"testing"
)

// Pause stops p (SIGSTOP), as a stalled process or a long GC pause would.
func Pause(t testing.TB, p *os.Process) {
	t.Helper()
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP: %v", err)
	}
}

// Resume continues p after Pause (SIGCONT).
func Resume(t testing.TB, p *os.Process) {
	t.Helper()
	if err := p.Signal(syscall.SIGCONT); err != nil {
		t.Fatalf("SIGCONT: %v", err)
	}
}

// ResumeQuietly continues p if it was paused, for cleanups; errors are ignored.
func ResumeQuietly(p *os.Process) { _ = p.Signal(syscall.SIGCONT) }
