package lease_test

import (
	"context"
	"testing"

	"github.com/fenced-lease/fenced-lease/go/internal/testenv"
	"github.com/fenced-lease/fenced-lease/go/lease"
	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
)

// Without a logger in the context, logs go to controller-runtime's root logger (testenv
// sets it), not nowhere; with one, to it.
func TestLogsFallBackToControllerRuntimes(t *testing.T) {
	lease.Logger(context.Background()).Info("fallback probe 5d1c")
	if !testenv.Logged("fallback probe 5d1c") {
		t.Fatal("a log without a logger in the context did not reach ctrl.Log")
	}
	var lines []string
	mine := funcr.New(func(_, args string) { lines = append(lines, args) }, funcr.Options{})
	lease.Logger(logr.NewContext(context.Background(), mine)).Info("hello")
	if len(lines) != 1 || testenv.Logged("hello") {
		t.Fatalf("the context's logger got %v", lines)
	}
}
