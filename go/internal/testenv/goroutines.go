package testenv

import (
	"bytes"
	"runtime"
	"strings"
	"testing"
	"time"
)

// NoGoroutinesOf fails the test unless, within limit, no goroutine runs code of the package
// with import path pkg (goroutines of other tests of the same package that still run are
// told apart by the marker functions given, if any).
func NoGoroutinesOf(t testing.TB, pkg string, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		left := goroutinesOf(pkg)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutine(s) of %s left after release:\n%s", len(left), pkg, strings.Join(left, "\n\n"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func goroutinesOf(pkg string) []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var left []string
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		s := string(g)
		if strings.Contains(s, pkg+".") && !strings.Contains(s, "testing.tRunner") {
			left = append(left, s)
		}
	}
	return left
}
