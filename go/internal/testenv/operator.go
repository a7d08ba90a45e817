package testenv

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// OperatorBinary is the operator to run: FL_OPERATOR_BIN, else the debug build's in
// CARGO_TARGET_DIR or the repository's target/.
func OperatorBinary() string {
	if b := os.Getenv("FL_OPERATOR_BIN"); b != "" {
		return b
	}
	target := os.Getenv("CARGO_TARGET_DIR")
	if target == "" {
		target = filepath.Join(RepoRoot(), "target")
	}
	return filepath.Join(target, "debug", "fenced-lease-operator")
}

// StartOperator runs the operator for namespace ns (leader election off), as the Rust tests
// do, until the test ends. Its log is printed if the test fails.
func StartOperator(t testing.TB, ns string) {
	t.Helper()
	kubeconfig := os.Getenv("KUBECONFIG")
	cmd := exec.Command(OperatorBinary(),
		"--operator-namespace", ns, "--namespace", ns,
		"--log-format", "text", "--metrics-addr", "127.0.0.1:0", "--leader-election=false")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig, "RUST_LOG=info,fenced_lease=debug", "NO_COLOR=1")
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s (cargo build --bin fenced-lease-operator): %v", OperatorBinary(), err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
		}
		if t.Failed() {
			t.Logf("operator log:\n%s", tail(log.Bytes(), 8000))
		}
	})
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
