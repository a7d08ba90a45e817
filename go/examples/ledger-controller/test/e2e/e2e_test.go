//go:build unix

// Package e2e runs replicas of the ledger controller against the local control plane.
package e2e

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fenced-lease/fenced-lease/go/examples/ledger-controller/internal/controller"
	"github.com/fenced-lease/fenced-lease/go/fence"
	"github.com/fenced-lease/fenced-lease/go/internal/testenv"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// replica is one running ledger-controller process and the lines it printed.
type replica struct {
	name    string
	cmd     *exec.Cmd
	lines   chan string
	exited  chan struct{}
	probe   string
	metrics string
}

func startReplica(t *testing.T, bin, ns, name string) *replica {
	t.Helper()
	probe, metrics := freeAddr(t), freeAddr(t)
	cmd := exec.Command(bin, "--namespace", ns, "--lease", "ledger-controller", "--identity", name,
		"--health-probe-bind-address", probe, "--metrics-bind-address", metrics)
	cmd.Env = os.Environ()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &replica{name: name, cmd: cmd, lines: make(chan string, 100000), exited: make(chan struct{}), probe: probe, metrics: metrics}
	go func() {
		s := bufio.NewScanner(out)
		for s.Scan() {
			r.lines <- s.Text()
		}
		close(r.lines)
		_ = cmd.Wait()
		close(r.exited)
	}()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop ends the replica with SIGTERM, as a rollout would.
func (r *replica) stop(t *testing.T) {
	testenv.ResumeQuietly(r.cmd.Process)
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.exited:
	case <-time.After(15 * time.Second):
		_ = r.cmd.Process.Kill()
		t.Errorf("%s did not stop on SIGTERM", r.name)
	}
}

// next is the rest of the next line that starts with prefix, within limit; lines that
// start with none of avoid may come before it.
func (r *replica) next(t *testing.T, prefix string, limit time.Duration, avoid ...string) string {
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
			for _, a := range avoid {
				if strings.HasPrefix(l, a) {
					t.Fatalf("%s printed %q before %q", r.name, l, prefix)
				}
			}
		case <-timeout:
			t.Fatalf("%s printed no %q within %v", r.name, prefix, limit)
		}
	}
}

func (r *replica) healthy(t *testing.T) {
	t.Helper()
	testenv.Eventually(t, r.name+"'s /healthz", 20*time.Second, func() error {
		resp, err := http.Get("http://" + r.probe + "/healthz")
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	})
}

// leader is the replica's fencedlease_leader gauge as its metrics endpoint serves it.
func (r *replica) leader(t *testing.T) string {
	t.Helper()
	var value string
	testenv.Eventually(t, r.name+"'s fencedlease_leader", 20*time.Second, func() error {
		resp, err := http.Get("http://" + r.metrics + "/metrics")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		for _, line := range strings.Split(string(body), "\n") {
			if strings.HasPrefix(line, "fencedlease_leader{") && strings.Contains(line, `identity="`+r.name+`"`) {
				value = line[strings.LastIndex(line, " ")+1:]
				return nil
			}
		}
		return errors.New("no fencedlease_leader")
	})
	return value
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func build(t *testing.T) string {
	bin := filepath.Join(t.TempDir(), "ledger-controller")
	out, err := exec.Command("go", "build", "-o", bin, "../../cmd").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func token(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		t.Fatalf("token %q", s)
	}
	return n
}

// Two replicas; the leader is paused (SIGSTOP) in the middle of a reconcile, past its
// lease. The other, a standby that served its probes meanwhile, leads with a higher token
// and its writes are accepted. The paused one, resumed, writes nothing more and leaves (exit
// 1: controller-runtime's rule on loss); a write stamped with its token, as one in flight
// during the pause would be, is refused by the apiserver. Restarted, as its Deployment
// would, it stands by, and leads again, writing with a new token, once the other stops.
func TestAPausedLeaderIsRefusedTheOtherLeadsAndTheFirstLeadsAgain(t *testing.T) {
	cfg := testenv.Config(t)
	admin := testenv.Client(t, cfg)
	ns := testenv.Namespace(t, admin, "go-ledger")
	testenv.StartOperator(t, ns)
	testenv.CreateLease(t, admin, ns, "ledger-controller", 3)
	bin := build(t)

	a := startReplica(t, bin, ns, "replica-a")
	first := token(t, a.next(t, "LEADING", 60*time.Second))
	if got := a.next(t, "WRITE ", 20*time.Second); got != fmt.Sprintf("accepted %d", first) {
		t.Fatalf("a's first write: %s", got)
	}
	b := startReplica(t, bin, ns, "replica-b")
	b.healthy(t) // a standby serves its probes and metrics
	if got, leading := b.leader(t), a.leader(t); got != "0" || leading != "1" {
		t.Fatalf("fencedlease_leader: standby %s, leader %s", got, leading)
	}
	if got := token(t, a.next(t, "WORKING", 10*time.Second)); got != first {
		t.Fatalf("a's reconciler has token %d from its context in term %d", got, first)
	}
	testenv.Pause(t, a.cmd.Process) // mid-reconcile: it has read the ledger and is working
	paused := time.Now()
	second := token(t, b.next(t, "LEADING", 30*time.Second))
	t.Logf("MEASURED paused leader replaced after %v (lease 3s)", time.Since(paused))
	if second <= first {
		t.Fatalf("b leads with token %d, a had %d", second, first)
	}
	if got := b.next(t, "WRITE ", 20*time.Second); got != fmt.Sprintf("accepted %d", second) {
		t.Fatalf("b's first write: %s", got)
	}

	testenv.Resume(t, a.cmd.Process)
	resumed := time.Now()
	a.next(t, "STOPPED", 10*time.Second, "WRITE accepted", "LEADING")
	select {
	case <-a.exited:
	case <-time.After(10 * time.Second):
		t.Fatal("a did not leave after losing its term")
	}
	t.Logf("MEASURED resumed leader left %v after SIGCONT, exit code %d", time.Since(resumed), a.cmd.ProcessState.ExitCode())
	if a.cmd.ProcessState.ExitCode() == 0 {
		t.Fatal("a left with exit code 0 after losing its term")
	}
	if got := b.next(t, "WRITE ", 20*time.Second); got != fmt.Sprintf("accepted %d", second) {
		t.Fatalf("b's write after a resumed: %s", got)
	}
	ctx := testenv.Ctx(t, testenv.APITimeout)
	ledger := &corev1.ConfigMap{}
	if err := admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: controller.LedgerName}, ledger); err != nil {
		t.Fatal(err)
	}
	stale := fence.NewClient(admin, "ledger-controller", fixed(first))
	ledger.Data["writer"] = "in flight"
	var f *fence.Fenced
	if err := stale.Update(ctx, ledger); !errors.As(err, &f) || f.Presented != first || f.Highest != second {
		t.Fatalf("a write stamped with the paused replica's token: %v", err)
	}

	again := startReplica(t, bin, ns, "replica-a") // restarted by its Deployment
	again.healthy(t)
	b.stop(t)
	third := token(t, again.next(t, "LEADING", 30*time.Second))
	if third <= second {
		t.Fatalf("a leads again with token %d after b's %d", third, second)
	}
	if got := again.next(t, "WRITE ", 20*time.Second); got != fmt.Sprintf("accepted %d", third) {
		t.Fatalf("a's write in its second term: %s", got)
	}
	if err := admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: controller.LedgerName}, ledger); err != nil {
		t.Fatal(err)
	}
	if tok, _ := fence.TokenOf(ledger); tok != third || ledger.Data["writer"] != "replica-a" {
		t.Fatalf("ledger written last with token %d by %s", tok, ledger.Data["writer"])
	}
}

type fixed int64

func (f fixed) Token() (int64, error) { return int64(f), nil }
