// Package testenv is the Go tests' harness: the local control plane started by
// hack/control-plane (KUBECONFIG), the CRDs and admission policies applied with kubectl as a
// user would, a fresh namespace per test, the operator as a real process, and PostgreSQL and
// Redis from hack/datastores (FL_POSTGRES_URL, FL_REDIS_URL).
//
// Without KUBECONFIG the integration tests are skipped, unless FL_REQUIRE_CLUSTER=1 (set by
// hack/go-test), which makes that a failure.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fenced-lease/fenced-lease/go/api/v1alpha1"
	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// controller-runtime's root logger (ctrl.Log) writes into Logged's memory, not the output.
func init() {
	ctrllog.SetLogger(funcr.New(func(prefix, args string) {
		logged.Lock()
		defer logged.Unlock()
		if len(logged.lines) == 1000 {
			logged.lines = logged.lines[1:]
		}
		logged.lines = append(logged.lines, prefix+" "+args)
	}, funcr.Options{}))
}

var logged struct {
	sync.Mutex
	lines []string
}

// Logged reports whether one of the last 1000 lines written to controller-runtime's root
// logger (ctrl.Log) contains s.
func Logged(s string) bool {
	logged.Lock()
	defer logged.Unlock()
	for _, l := range logged.lines {
		if strings.Contains(l, s) {
			return true
		}
	}
	return false
}

// APITimeout bounds every API call the harness makes.
const APITimeout = 20 * time.Second

// RepoRoot is the repository's top directory.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

// Scheme knows the built-in kinds and fencing.dev.
var Scheme = func() *k8sruntime.Scheme {
	s := k8sruntime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = v1alpha1.AddToScheme(s)
	return s
}()

var (
	installOnce sync.Once
	installErr  error
)

// Config is the admin's client config of the local control plane, with the CRDs and the
// admission policies installed (once per test binary).
func Config(t testing.TB) *rest.Config {
	t.Helper()
	kubeconfig := os.Getenv("KUBECONFIG")
	if kubeconfig == "" {
		if os.Getenv("FL_REQUIRE_CLUSTER") == "1" {
			t.Fatal("KUBECONFIG is not set: run eval \"$(hack/control-plane up)\" first, or hack/go-test")
		}
		t.Skip("KUBECONFIG not set: integration test skipped (hack/go-test runs it)")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatalf("kubeconfig %s: %v", kubeconfig, err)
	}
	cfg.Timeout = 0 // every call carries its own timeout
	cfg.QPS, cfg.Burst = 100, 200
	installOnce.Do(func() { installErr = install(kubeconfig) })
	if installErr != nil {
		t.Fatal(installErr)
	}
	return cfg
}

// Kubectl is the kubectl binary of hack/control-plane.
func Kubectl() (string, error) {
	if k := os.Getenv("FL_KUBECTL"); k != "" {
		return k, nil
	}
	out, err := exec.Command(filepath.Join(RepoRoot(), "hack", "control-plane"), "bin-dir").Output()
	if err != nil {
		return "", fmt.Errorf("hack/control-plane bin-dir: %w", err)
	}
	return filepath.Join(strings.TrimSpace(string(out)), "kubectl"), nil
}

func install(kubeconfig string) error {
	kubectl, err := Kubectl()
	if err != nil {
		return err
	}
	// hack/crds applies crds/ and deploy/admission/ and waits until both kinds can be
	// created: Established is not enough while admission has not yet seen the claim's schema.
	cmd := exec.Command(filepath.Join(RepoRoot(), "hack", "crds"), "install")
	cmd.Env = append(os.Environ(), "KUBECTL="+kubectl, "KUBECONFIG="+kubeconfig)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("hack/crds install: %v\n%s", err, out)
	}
	return nil
}

// Client is a controller-runtime client of the admin.
func Client(t testing.TB, cfg *rest.Config) client.Client {
	t.Helper()
	c, err := client.New(cfg, client.Options{Scheme: Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Ctx is a context that ends with the test (and after limit at the latest).
func Ctx(t testing.TB, limit time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	t.Cleanup(cancel)
	return ctx
}

// Call is a context for one API call.
func Call() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), APITimeout)
}

// RandomSuffix is 8 random hex digits.
func RandomSuffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Namespace creates namespace <prefix>-<random> for one test, deleted after it.
func Namespace(t testing.TB, c client.Client, prefix string) string {
	t.Helper()
	name := prefix + "-" + RandomSuffix()
	ctx, cancel := Call()
	defer cancel()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := Call()
		defer cancel()
		_ = c.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
	})
	return name
}

// CreateLease creates FencedLease name with a duration of seconds.
func CreateLease(t testing.TB, c client.Client, ns, name string, seconds int32) {
	t.Helper()
	ctx, cancel := Call()
	defer cancel()
	l := &v1alpha1.FencedLease{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       v1alpha1.FencedLeaseSpec{LeaseDurationSeconds: seconds},
	}
	if err := c.Create(ctx, l); err != nil {
		t.Fatalf("create lease: %v", err)
	}
}

// Eventually polls check every 20 ms until it returns nil, failing the test with what it
// waited for and the last error after limit.
func Eventually(t testing.TB, what string, limit time.Duration, check func() error) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s: %v", limit, what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
