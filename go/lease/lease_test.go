package lease_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fenced-lease/fenced-lease/go/api/v1alpha1"
	"github.com/fenced-lease/fenced-lease/go/internal/testenv"
	"github.com/fenced-lease/fenced-lease/go/lease"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

const (
	wait    = 30 * time.Second
	libPath = "github.com/fenced-lease/fenced-lease/go/lease"
)

type env struct {
	cfg   *rest.Config
	admin client.Client
	ns    string
	c     *lease.Client
}

// setup gives a test its namespace, an operator watching it, and lease name of seconds.
func setup(t *testing.T, prefix, name string, seconds int32) *env {
	t.Helper()
	cfg := testenv.Config(t)
	e := &env{cfg: cfg, admin: testenv.Client(t, cfg)}
	e.ns = testenv.Namespace(t, e.admin, prefix)
	testenv.StartOperator(t, e.ns)
	if name != "" {
		testenv.CreateLease(t, e.admin, e.ns, name, seconds)
	}
	e.c = newClient(t, cfg)
	return e
}

func newClient(t *testing.T, cfg *rest.Config) *lease.Client {
	c, err := lease.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (e *env) acquire(t *testing.T, ctx context.Context, name, identity string) *lease.Lease {
	t.Helper()
	l, err := lease.Acquire(ctx, e.c, e.ns, name, lease.Options{Identity: identity, Wait: wait})
	if err != nil {
		t.Fatalf("%s acquires: %v", identity, err)
	}
	return l
}

// deleteClaimOf deletes identity's claim, as its owner or an admin may: its holder loses the
// lease at once.
func (e *env) deleteClaimOf(t *testing.T, identity string) {
	t.Helper()
	c := e.claimsOf(t, identity)[0]
	call, cancel := testenv.Call()
	defer cancel()
	if err := e.admin.Delete(call, &c); err != nil {
		t.Fatal(err)
	}
}

func (e *env) claimsOf(t *testing.T, identity string) []v1alpha1.FencedLeaseClaim {
	t.Helper()
	ctx, cancel := testenv.Call()
	defer cancel()
	var list v1alpha1.FencedLeaseClaimList
	if err := e.admin.List(ctx, &list, client.InNamespace(e.ns)); err != nil {
		t.Fatalf("list claims: %v", err)
	}
	var mine []v1alpha1.FencedLeaseClaim
	for _, c := range list.Items {
		if c.Spec.HolderIdentity == identity {
			mine = append(mine, c)
		}
	}
	return mine
}

func (e *env) phaseOf(t *testing.T, identity string) v1alpha1.ClaimPhase {
	c := e.claimsOf(t, identity)
	if len(c) == 0 || c[0].Status == nil {
		return ""
	}
	return c[0].Status.Phase
}

func (e *env) noClaimOf(t *testing.T, identity string) {
	t.Helper()
	testenv.Eventually(t, "the claim of "+identity+" to be gone", wait, func() error {
		if n := len(e.claimsOf(t, identity)); n > 0 {
			return fmt.Errorf("%d claim(s) left", n)
		}
		return nil
	})
}

func token(t *testing.T, l *lease.Lease) int64 {
	t.Helper()
	tok, err := l.Token()
	if err != nil {
		t.Fatalf("%s does not hold: %v", l.Identity(), err)
	}
	return tok
}

func release(t *testing.T, l *lease.Lease) {
	t.Helper()
	ctx, cancel := testenv.Call()
	defer cancel()
	if err := l.Release(ctx); err != nil {
		t.Fatalf("release: %v", err)
	}
}

// I4: the grant is learnt by watch, and a release hands over at once; nothing of the
// library keeps running after release.
func TestGrantComesByWatchAndReleaseHandsOverAtOnce(t *testing.T) {
	e := setup(t, "go-handover", "db", 15)
	ctx := testenv.Ctx(t, 2*time.Minute)
	release(t, e.acquire(t, ctx, "db", "warm-up")) // the first grant proves the operator is up
	asked := time.Now()
	first := e.acquire(t, ctx, "db", "first")
	t.Logf("MEASURED uncontended acquire: %v", time.Since(asked))
	tok := token(t, first)

	type result struct {
		l   *lease.Lease
		at  time.Time
		err error
	}
	second := make(chan result, 1)
	go func() {
		l, err := lease.Acquire(ctx, e.c, e.ns, "db", lease.Options{Identity: "second", Wait: wait})
		second <- result{l, time.Now(), err}
	}()
	testenv.Eventually(t, "the second claim to queue", wait, func() error {
		if p := e.phaseOf(t, "second"); p != v1alpha1.ClaimPending {
			return fmt.Errorf("phase %q", p)
		}
		return nil
	})
	releasedAt := time.Now()
	release(t, first)
	if first.Held() || !errors.Is(first.Err(), lease.ErrLost) {
		t.Fatalf("a released lease is still held: %v", first.Err())
	}
	r := <-second
	if r.err != nil {
		t.Fatalf("second acquires: %v", r.err)
	}
	handover := r.at.Sub(releasedAt)
	t.Logf("MEASURED release -> next holder granted (via watch): %v", handover)
	if token(t, r.l) <= tok {
		t.Fatalf("token %d after %d", token(t, r.l), tok)
	}
	if handover > 700*time.Millisecond {
		t.Errorf("hand-over took %v", handover)
	}
	release(t, r.l)
	e.noClaimOf(t, "second")
	testenv.NoGoroutinesOf(t, libPath, 5*time.Second)
}

func TestAMissingLeaseIsErrLeaseNotFoundAndLeavesNoClaim(t *testing.T) {
	e := setup(t, "go-missing", "", 0)
	_, err := lease.Acquire(testenv.Ctx(t, time.Minute), e.c, e.ns, "nope", lease.Options{Identity: "me", Wait: wait})
	if !errors.Is(err, lease.ErrLeaseNotFound) {
		t.Fatalf("err = %v, want ErrLeaseNotFound", err)
	}
	e.noClaimOf(t, "me")
}

// NoWait takes a held lease never, a timed wait gives up, a cancelled wait returns the
// context's error; each withdraws its claim.
func TestWaitsThatEndWithdrawTheirClaims(t *testing.T) {
	e := setup(t, "go-waits", "db", 15)
	ctx := testenv.Ctx(t, 2*time.Minute)
	holder := e.acquire(t, ctx, "db", "holder")
	defer release(t, holder)

	_, err := lease.Acquire(ctx, e.c, e.ns, "db", lease.Options{Identity: "no-wait", Wait: lease.NoWait})
	if !errors.Is(err, lease.ErrTimeout) {
		t.Fatalf("NoWait on a held lease: %v, want ErrTimeout", err)
	}
	started := time.Now()
	_, err = lease.Acquire(ctx, e.c, e.ns, "db", lease.Options{Identity: "timed", Wait: time.Second})
	if !errors.Is(err, lease.ErrTimeout) || time.Since(started) > 5*time.Second {
		t.Fatalf("a 1s wait: %v after %v", err, time.Since(started))
	}
	cancelled, cancel := context.WithCancel(ctx)
	time.AfterFunc(time.Second, cancel)
	_, err = lease.Acquire(cancelled, e.c, e.ns, "db", lease.Options{Identity: "forever"})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled wait: %v, want context.Canceled", err)
	}
	for _, who := range []string{"no-wait", "timed", "forever"} {
		e.noClaimOf(t, who)
	}
	if token(t, holder) <= 0 {
		t.Fatal("the holder lost the lease")
	}
}

// Cancelling the context given to Acquire releases the lease: the next waiter is granted
// without waiting for expiry, and the lease's Context is cancelled with ErrLost as cause.
func TestCancellingTheContextReleases(t *testing.T) {
	e := setup(t, "go-cancel", "db", 15)
	ctx := testenv.Ctx(t, 2*time.Minute)
	holding, cancel := context.WithCancel(ctx)
	first := e.acquire(t, holding, "db", "first")
	tok := token(t, first)
	next := make(chan *lease.Lease, 1)
	go func() {
		l, err := lease.Acquire(ctx, e.c, e.ns, "db", lease.Options{Identity: "next", Wait: wait})
		if err != nil {
			t.Errorf("next acquires: %v", err)
		}
		next <- l
	}()
	testenv.Eventually(t, "next to queue", wait, func() error {
		if p := e.phaseOf(t, "next"); p != v1alpha1.ClaimPending {
			return fmt.Errorf("phase %q", p)
		}
		return nil
	})
	cancelledAt := time.Now()
	cancel()
	select {
	case <-first.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the lease's context was not cancelled")
	}
	var lost *lease.LostError
	if !errors.As(context.Cause(first.Context()), &lost) || lost.Reason != lease.Released {
		t.Fatalf("cause %v, want a LostError (released)", context.Cause(first.Context()))
	}
	l := <-next
	if l == nil {
		t.FailNow()
	}
	t.Logf("MEASURED context cancelled -> next holder granted: %v", time.Since(cancelledAt))
	if time.Since(cancelledAt) > 5*time.Second || token(t, l) <= tok {
		t.Fatalf("next holder after %v with token %d (was %d)", time.Since(cancelledAt), token(t, l), tok)
	}
	release(t, l)
	release(t, first) // after its context ended: only waits
	testenv.NoGoroutinesOf(t, libPath, 5*time.Second)
}

func TestADeletedClaimIsLostAtOnce(t *testing.T) {
	e := setup(t, "go-deleted", "db", 15)
	ctx := testenv.Ctx(t, 2*time.Minute)
	l := e.acquire(t, ctx, "db", "holder")
	tok := token(t, l)
	e.deleteClaimOf(t, "holder")
	select {
	case <-l.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done was not closed after the claim's deletion")
	}
	var lost *lease.LostError
	if _, err := l.Token(); !errors.As(err, &lost) || lost.Reason != lease.ClaimDeleted || lost.Token != tok {
		t.Fatalf("Token after deletion: %v", err)
	}
	next := e.acquire(t, ctx, "db", "next")
	if token(t, next) <= tok {
		t.Fatal("the next token is not greater")
	}
	release(t, next)
	release(t, l)
}

func TestARefusedAccountIsErrForbidden(t *testing.T) {
	e := setup(t, "go-forbidden", "db", 15)
	sa := testenv.ServiceAccountConfig(t, e.cfg, e.ns, "nobody")
	_, err := lease.Acquire(testenv.Ctx(t, time.Minute), newClient(t, sa), e.ns, "db", lease.Options{Identity: "nobody", Wait: wait})
	if !errors.Is(err, lease.ErrForbidden) {
		t.Fatalf("err = %v, want ErrForbidden", err)
	}
}

// I10: a term's duration is fixed at grant; an edit of spec.leaseDurationSeconds applies
// from the next grant.
func TestI10TheTermIsFixedAtGrant(t *testing.T) {
	e := setup(t, "go-i10", "db", 30)
	ctx := testenv.Ctx(t, 2*time.Minute)
	first := e.acquire(t, ctx, "db", "first")
	if first.Duration() != 30*time.Second {
		t.Fatalf("term %v, want 30s", first.Duration())
	}
	call, cancel := testenv.Call()
	defer cancel()
	patch := client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"leaseDurationSeconds":3}}`))
	if err := e.admin.Patch(call, &v1alpha1.FencedLease{ObjectMeta: metaOf(e.ns, "db")}, patch); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // no event to wait for: the edit must change nothing
	if first.Duration() != 30*time.Second || !first.Held() {
		t.Fatalf("the running term changed: %v, held %v", first.Duration(), first.Held())
	}
	release(t, first)
	second := e.acquire(t, ctx, "db", "second")
	if second.Duration() != 3*time.Second {
		t.Fatalf("next term %v, want 3s", second.Duration())
	}
	release(t, second)
}
