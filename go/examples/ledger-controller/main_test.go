package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fenced-lease/fenced-lease/go/fence"
	"github.com/fenced-lease/fenced-lease/go/internal/testenv"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// replica is one running ledger-controller and the lines it printed.
type replica struct {
	name  string
	cmd   *exec.Cmd
	lines chan string
}

func startReplica(t *testing.T, bin, ns, name string) *replica {
	t.Helper()
	cmd := exec.Command(bin, "--namespace", ns, "--lease", "ledger-controller", "--identity", name)
	cmd.Env = os.Environ()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &replica{name: name, cmd: cmd, lines: make(chan string, 100000)}
	go func() {
		s := bufio.NewScanner(out)
		for s.Scan() {
			r.lines <- s.Text()
		}
		close(r.lines)
	}()
	t.Cleanup(func() {
		testenv.ResumeQuietly(cmd.Process)
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("%s did not stop on SIGTERM", name)
		}
	})
	return r
}

// next is the next line that starts with prefix (the rest of it), within limit.
func (r *replica) next(t *testing.T, prefix string, limit time.Duration) string {
	t.Helper()
	timeout := time.After(limit)
	for {
		select {
		case l, ok := <-r.lines:
			if !ok {
				t.Fatalf("%s ended before %q", r.name, prefix)
			}
			if rest, found := strings.CutPrefix(l, prefix); found {
				return strings.TrimSpace(rest)
			}
		case <-timeout:
			t.Fatalf("%s printed no %q within %v", r.name, prefix, limit)
		}
	}
}

func build(t *testing.T) string {
	bin := filepath.Join(t.TempDir(), "ledger-controller")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// Two replicas; the leader is paused (SIGSTOP) in the middle of a reconcile, past its
// lease: the other is granted a higher token and its writes are accepted; the paused one,
// resumed, has its write refused and stops leading; a write stamped with its old token, as
// one in flight during the pause would be, is refused by the apiserver.
func TestAPausedReplicasWritesAreRefusedAndTheOthersAccepted(t *testing.T) {
	cfg := testenv.Config(t)
	admin := testenv.Client(t, cfg)
	ns := testenv.Namespace(t, admin, "go-ledger")
	testenv.StartOperator(t, ns)
	testenv.CreateLease(t, admin, ns, "ledger-controller", 3)
	bin := build(t)

	a := startReplica(t, bin, ns, "replica-a")
	old, _ := strconv.ParseInt(a.next(t, "LEADING", 60*time.Second), 10, 64)
	if got := a.next(t, "WRITE ", 20*time.Second); got != fmt.Sprintf("accepted %d", old) {
		t.Fatalf("a's first write: %s", got)
	}
	b := startReplica(t, bin, ns, "replica-b")
	a.next(t, "WORKING", 10*time.Second)
	testenv.Pause(t, a.cmd.Process) // mid-reconcile: it has read the ledger and is working
	paused := time.Now()
	newer, _ := strconv.ParseInt(b.next(t, "LEADING", 30*time.Second), 10, 64)
	t.Logf("MEASURED paused leader replaced after %v (lease 3s)", time.Since(paused))
	if newer <= old {
		t.Fatalf("b leads with token %d, a had %d", newer, old)
	}
	if got := b.next(t, "WRITE ", 20*time.Second); got != fmt.Sprintf("accepted %d", newer) {
		t.Fatalf("b's first write: %s", got)
	}
	testenv.Resume(t, a.cmd.Process)
	got := a.next(t, "WRITE ", 10*time.Second)
	if !strings.HasPrefix(got, "refused") {
		t.Fatalf("the resumed replica's write: %s", got)
	}
	t.Logf("the resumed replica's write: %s", got)
	a.next(t, "STOPPED", 10*time.Second)
	if got := b.next(t, "WRITE ", 20*time.Second); got != fmt.Sprintf("accepted %d", newer) {
		t.Fatalf("b's write after a resumed: %s", got)
	}

	ctx := testenv.Ctx(t, testenv.APITimeout)
	ledger := &corev1.ConfigMap{}
	if err := admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: LedgerName}, ledger); err != nil {
		t.Fatal(err)
	}
	if tok, _ := fence.TokenOf(ledger); tok != newer || ledger.Data["writer"] != "replica-b" {
		t.Fatalf("ledger written last with token %d by %s", tok, ledger.Data["writer"])
	}
	stale := fence.NewClient(admin, "ledger-controller", fixed(old))
	ledger.Data["writer"] = "in flight"
	var f *fence.Fenced
	if err := stale.Update(ctx, ledger); !errors.As(err, &f) || f.Presented != old || f.Highest != newer {
		t.Fatalf("a write stamped with the paused replica's token: %v", err)
	}
}

type fixed int64

func (f fixed) Token() (int64, error) { return int64(f), nil }
