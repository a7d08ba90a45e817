package lease_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fenced-lease/fenced-lease/go/api/v1alpha1"
	"github.com/fenced-lease/fenced-lease/go/internal/testenv"
	"github.com/fenced-lease/fenced-lease/go/lease"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// holdDBMigrate is the README's Go example, between the markers: the README must show it
// verbatim (TestReadmeGoExample).
func holdDBMigrate(ctx context.Context, config *rest.Config, namespace string) error {
	// README: go
	c, err := lease.NewClient(config) // a *rest.Config, e.g. ctrl.GetConfigOrDie()
	if err != nil {
		return err
	}
	l, err := lease.Acquire(ctx, c, namespace, "db-migrate", lease.Options{Wait: 30 * time.Second})
	if err != nil {
		return err // errors.Is(err, lease.ErrTimeout), lease.ErrForbidden, ...
	}
	defer l.Release(context.Background()) // the next waiter is granted at once
	token, err := l.Token()               // refuses once the lease may have been lost
	if err != nil {
		return err
	}
	return migrate(l.Context(), token) // cancelled when the lease is lost; send token with every write
	// README: end
}

// migrate stands for the work done under the lease.
func migrate(ctx context.Context, token int64) error {
	fmt.Println("holding db-migrate with token", token)
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-time.After(200 * time.Millisecond):
		return nil
	}
}

// goExample is the lines between "// README: go" and "// README: end" of this file, one
// tab of indentation taken off.
func goExample(t *testing.T) string {
	t.Helper()
	source, err := os.ReadFile("readme_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, _ := strings.Cut(string(source), "// README: go\n")
	body, _, found := strings.Cut(rest, "\t// README: end")
	if !found {
		t.Fatal("no README markers in readme_test.go")
	}
	var lines []string
	for _, line := range strings.Split(strings.TrimRight(body, "\n"), "\n") {
		lines = append(lines, strings.TrimPrefix(line, "\t"))
	}
	return strings.Join(lines, "\n")
}

// The root README's Go example is this file's, and it runs: it takes the lease, prints the
// token, and releases (no claim left behind).
func TestReadmeGoExample(t *testing.T) {
	example := goExample(t)
	readme, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "```go\n"+example+"\n```") {
		t.Fatalf("README.md does not show the example of go/lease/readme_test.go:\n%s", example)
	}

	e := setup(t, "go-readme", "db-migrate", 15)
	ctx := testenv.Ctx(t, time.Minute)
	if err := holdDBMigrate(ctx, e.cfg, e.ns); err != nil {
		t.Fatalf("the README example: %v", err)
	}
	testenv.Eventually(t, "the example's claim to be released", wait, func() error {
		call, cancel := testenv.Call()
		defer cancel()
		var claims v1alpha1.FencedLeaseClaimList
		if err := e.admin.List(call, &claims, client.InNamespace(e.ns)); err != nil {
			return err
		}
		if n := len(claims.Items); n > 0 {
			return fmt.Errorf("%d claim(s) left", n)
		}
		return nil
	})
}
