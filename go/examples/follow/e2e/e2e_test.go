//go:build linux

// Package e2e runs the two example controllers of ../ (client-go's leaderelection, and a
// controller-runtime manager with LeaderElection: true), neither with any fenced-lease code,
// as two replicas each, authenticating as two pods (tokens bound to them, as pods mount), the
// manager's default identity made of its pod's name (a UTS namespace whose hostname is the
// pod's). A FencedLease follows their Lease and fences ConfigMaps. The leader is paused
// (SIGSTOP) past its Lease, the other takes the Lease by client-go's own rules, the paused one
// resumes still sure it leads and keeps writing: the apiserver refuses every one of its writes,
// and accepts the new leader's.
package e2e

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fenced-lease/fenced-lease/go/api/v1alpha1"
	"github.com/fenced-lease/fenced-lease/go/internal/testenv"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The examples' Lease timings: a paused leader is replaced after about 4 s, and a resumed one
// believes it leads for up to RenewDeadline more (client-go's renew loop retries until then).
var timings = []string{"-lease-duration", "4s", "-renew-deadline", "3s", "-retry-period", "500ms"}

// replica is one running example controller and the lines it printed.
type replica struct {
	pod    string
	cmd    *exec.Cmd
	lines  chan string
	exited chan struct{}
}

func start(t *testing.T, argv []string, pod string) *replica {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	// A group of its own: signals reach the controller under unshare and sh too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &replica{pod: pod, cmd: cmd, lines: make(chan string, 100000), exited: make(chan struct{})}
	go func() {
		s := bufio.NewScanner(out)
		for s.Scan() {
			r.lines <- s.Text()
		}
		close(r.lines)
		_ = cmd.Wait()
		close(r.exited)
	}()
	t.Cleanup(func() {
		_ = r.signal(syscall.SIGCONT)
		_ = r.signal(syscall.SIGKILL)
		<-r.exited
	})
	return r
}

// signal sends sig to the replica's process group.
func (r *replica) signal(sig syscall.Signal) error {
	return syscall.Kill(-r.cmd.Process.Pid, sig)
}

// next waits up to limit for a line starting with prefix; the lines before it are returned
// too.
func (r *replica) next(t *testing.T, prefix string, limit time.Duration) []string {
	t.Helper()
	timeout := time.After(limit)
	var seen []string
	for {
		select {
		case l, ok := <-r.lines:
			if !ok {
				t.Fatalf("%s ended before %q; it printed %q", r.pod, prefix, seen)
			}
			seen = append(seen, l)
			if strings.HasPrefix(l, prefix) {
				return seen
			}
		case <-timeout:
			t.Fatalf("%s printed no %q within %v (last lines: %q)", r.pod, prefix, limit, tail(seen))
		}
	}
}

// stop stops the replica's process group with SIGSTOP and returns once every process of the
// group is stopped and what they printed before is read (and dropped): what the replica prints
// after stop is what it did after it resumed.
func (r *replica) stop(t *testing.T) {
	t.Helper()
	if err := r.signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !groupStopped(r.cmd.Process.Pid) {
		if time.Now().After(deadline) {
			t.Fatalf("%s's processes are not all stopped 10 s after SIGSTOP", r.pod)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Stopped: nothing more is written to the pipe; read what is in it.
	for {
		select {
		case _, ok := <-r.lines:
			if !ok {
				return
			}
		case <-time.After(200 * time.Millisecond):
			return
		}
	}
}

// groupStopped says whether every process of process group pgid is stopped (state T), from
// /proc/<pid>/stat: "pid (comm) state ppid pgrp ...".
func groupStopped(pgid int) bool {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	members := 0
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(fields) < 3 || fields[2] != strconv.Itoa(pgid) {
			continue
		}
		members++
		if fields[0] != "T" && fields[0] != "t" {
			return false
		}
	}
	return members > 0
}

// rest collects what r prints until it exits, or until limit.
func (r *replica) rest(limit time.Duration) []string {
	timeout := time.After(limit)
	var seen []string
	for {
		select {
		case l, ok := <-r.lines:
			if !ok {
				return seen
			}
			seen = append(seen, l)
		case <-timeout:
			return seen
		}
	}
}

func tail(lines []string) []string {
	if len(lines) > 5 {
		return lines[len(lines)-5:]
	}
	return lines
}

func count(lines []string, prefix string) int {
	n := 0
	for _, l := range lines {
		if strings.HasPrefix(l, prefix) {
			n++
		}
	}
	return n
}

// setup makes namespace, operator, the controllers' ServiceAccount and Role, ConfigMap work,
// FencedLease "fenced" following Lease lease, and two pods; it returns the kubeconfig of each.
func setup(t *testing.T, lease string) (string, map[string]string) {
	t.Helper()
	admin := testenv.Config(t)
	c := testenv.Client(t, admin)
	ns := testenv.Namespace(t, c, "follow")
	testenv.StartOperator(t, ns)
	ctx, cancel := testenv.Call()
	defer cancel()
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "controller"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "create", "update"}},
			{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "patch"}},
			{APIGroups: []string{"", "events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
		},
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "controller"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "controller"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "controller", Namespace: ns}},
	}
	objects := []client.Object{
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "controller"}},
		role, binding,
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "work"}},
		&v1alpha1.FencedLease{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "fenced"},
			Spec: v1alpha1.FencedLeaseSpec{
				Follow: &v1alpha1.FollowSpec{Lease: lease},
				Fence:  &v1alpha1.FenceSpec{Resources: []v1alpha1.FencedResource{{Resource: "configmaps"}}},
			},
		},
	}
	for _, o := range objects {
		if err := c.Create(ctx, o); err != nil {
			t.Fatalf("create %T: %v", o, err)
		}
	}
	configs := map[string]string{}
	for _, pod := range []string{"pa", "pb"} {
		cfg, _ := testenv.PodConfig(t, admin, ns, "controller", pod)
		configs[pod] = testenv.Kubeconfig(t, cfg, pod)
	}
	return ns, configs
}

func build(t *testing.T, pkg string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), filepath.Base(pkg))
	out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput()
	if err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, out)
	}
	return bin
}

// hostnamed runs argv in a UTS namespace of its own whose hostname is pod, as in the pod.
func hostnamed(pod string, argv ...string) []string {
	return append([]string{"unshare", "--uts", "--fork", "sh", "-c", `hostname "$0" && exec "$@"`, pod}, argv...)
}

// pausedLeaderIsRefused runs the scenario with the replicas argv gives for each pod: up to
// three attempts, the roles swapped each time, until the paused leader wrote after it resumed
// (a leader paused in the middle of its renewal stops at once when it resumes, without a
// write: that attempt shows nothing).
func pausedLeaderIsRefused(t *testing.T, argv func(pod string) []string) {
	leader := start(t, argv("pa"), "pa")
	leader.next(t, "leading", 30*time.Second)
	leader.next(t, "wrote", 30*time.Second) // once the FencedLease names its pod
	other := start(t, argv("pb"), "pb")
	for attempt := 1; attempt <= 3; attempt++ {
		leader.stop(t)
		other.next(t, "leading", 30*time.Second)
		other.next(t, "wrote", 30*time.Second) // the FencedLease names the new leader's pod
		if err := leader.signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		after := leader.rest(10 * time.Second)
		refused, wrote := count(after, "refused"), count(after, "wrote")
		t.Logf("attempt %d: %s resumed and printed %d refused and %d accepted writes, then %q",
			attempt, leader.pod, refused, wrote, tail(after))
		if wrote > 0 {
			t.Fatalf("%s wrote after %s took the Lease: %q", leader.pod, other.pod, after)
		}
		for _, l := range after {
			if strings.HasPrefix(l, "refused") && !strings.Contains(l, "does not hold FencedLease") {
				t.Fatalf("%s was refused, but not by the fence: %q", leader.pod, l)
			}
		}
		other.next(t, "wrote", 10*time.Second) // and the new leader goes on
		if refused > 0 {
			return
		}
		leader, other = other, start(t, argv(leader.pod), leader.pod)
	}
	t.Fatal("in three attempts the paused leader never wrote after it resumed")
}

func TestAPausedClientGoLeaderIsRefusedOnceTheLeaseNamesAnother(t *testing.T) {
	ns, configs := setup(t, "elector")
	bin := build(t, "../elector")
	pausedLeaderIsRefused(t, func(pod string) []string {
		return append([]string{bin, "-kubeconfig", configs[pod], "-namespace", ns, "-lease", "elector",
			"-id", pod, "-configmap", "work"}, timings...)
	})
}

func TestAPausedManagerLeaderIsRefusedOnceTheLeaseNamesAnother(t *testing.T) {
	if out, err := exec.Command("unshare", "--uts", "--fork", "true").CombinedOutput(); err != nil {
		t.Fatalf("this test runs each replica with its pod's name as hostname, as in a pod "+
			"(unshare --uts, which needs root): %v %s", err, out)
	}
	ns, configs := setup(t, "manager")
	bin := build(t, "../manager")
	pausedLeaderIsRefused(t, func(pod string) []string {
		return hostnamed(pod, append([]string{bin, "-kubeconfig", configs[pod], "-namespace", ns,
			"-lease", "manager", "-configmap", "work"}, timings...)...)
	})
}
