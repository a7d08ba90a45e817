package lock_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced-lease/fenced-lease/go/api/v1alpha1"
	"github.com/fenced-lease/fenced-lease/go/fence"
	"github.com/fenced-lease/fenced-lease/go/internal/testenv"
	"github.com/fenced-lease/fenced-lease/go/lease"
	"github.com/fenced-lease/fenced-lease/go/lock"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

const leaseName = "ctl"

// candidate runs client-go's elector on a Lock, a new LeaderElector after each term, as a
// process that leads again would. At the start of each term it writes the ConfigMap
// "ledger" through the stamping client, and reports "leading <token>", "wrote <token>" or
// "refused <error>", and "stopped".
type candidate struct {
	name   string
	lock   *lock.Lock
	events chan string
	stop   context.CancelFunc
	ran    sync.WaitGroup
	ledAt  atomic.Int64 // when the elector last started leading (Unix nanoseconds)
}

func startCandidate(t *testing.T, cfg *rest.Config, admin client.Client, ns, name string) *candidate {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	lk, err := lock.New(ctx, cfg, lock.Config{Namespace: ns, Name: leaseName, Identity: name})
	if err != nil {
		t.Fatal(err)
	}
	c := &candidate{name: name, lock: lk, events: make(chan string, 1000), stop: stop}
	writer := fence.NewClient(admin, leaseName, lk)
	callbacks := leaderelection.LeaderCallbacks{
		OnStartedLeading: func(context.Context) {
			c.ledAt.Store(time.Now().UnixNano())
			token, err := lk.Token()
			c.events <- fmt.Sprintf("leading %d %v", token, err)
			c.events <- write(ctx, writer, ns, name)
		},
		OnStoppedLeading: func() { c.events <- "stopped" },
	}
	c.ran.Add(1)
	go func() {
		defer c.ran.Done()
		for ctx.Err() == nil {
			le, err := leaderelection.NewLeaderElector(lk.LeaderElectionConfig(callbacks))
			if err != nil {
				c.events <- "elector: " + err.Error()
				return
			}
			le.Run(ctx)
		}
	}()
	t.Cleanup(c.halt)
	return c
}

// halt stops campaigning: the elector releases, the lock deletes its claim.
func (c *candidate) halt() {
	c.stop()
	c.ran.Wait()
	<-c.lock.Done()
}

func write(ctx context.Context, c client.Client, ns, writer string) string {
	ledger := &corev1.ConfigMap{}
	err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "ledger"}, ledger)
	switch {
	case apierrors.IsNotFound(err):
		ledger = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ledger"}, Data: map[string]string{"writer": writer}}
		err = c.Create(ctx, ledger)
	case err == nil:
		ledger.Data = map[string]string{"writer": writer}
		err = c.Update(ctx, ledger)
	}
	if err != nil {
		return "refused " + err.Error()
	}
	token, _ := fence.TokenOf(ledger)
	return fmt.Sprintf("wrote %d", token)
}

// next is the next event, which must start with prefix; the rest of it.
func (c *candidate) next(t *testing.T, prefix string, limit time.Duration) string {
	t.Helper()
	select {
	case e := <-c.events:
		rest, ok := strings.CutPrefix(e, prefix)
		if !ok {
			t.Fatalf("%s: %q, want %q", c.name, e, prefix)
		}
		return strings.TrimSpace(rest)
	case <-time.After(limit):
		t.Fatalf("%s: no %q within %v", c.name, prefix, limit)
	}
	return ""
}

// leads waits for the next term, checks it writes with its token, and returns the token.
func (c *candidate) leads(t *testing.T, limit time.Duration) int64 {
	t.Helper()
	fields := strings.Fields(c.next(t, "leading", limit))
	token, _ := strconv.ParseInt(fields[0], 10, 64)
	if len(fields) != 2 || fields[1] != "<nil>" || token <= 0 {
		t.Fatalf("%s leads with token %v", c.name, fields)
	}
	if got := c.next(t, "wrote", 10*time.Second); got != fields[0] {
		t.Fatalf("%s wrote with token %s in term %d", c.name, got, token)
	}
	return token
}

// One process leads, loses (its claim revoked: deleted), sees the loss and stops leading,
// and leads again once the other candidate stops, writing in its second term with a new
// token; its first term's token is refused by the apiserver meanwhile.
func TestOneProcessLeadsLosesAndLeadsAgainWritingInItsSecondTerm(t *testing.T) {
	cfg := testenv.Config(t)
	admin := testenv.Client(t, cfg)
	ns := testenv.Namespace(t, admin, "go-lock")
	testenv.StartOperator(t, ns)
	testenv.CreateLease(t, admin, ns, leaseName, 3)

	a := startCandidate(t, cfg, admin, ns, "a")
	first := a.leads(t, 60*time.Second)
	if _, err := a.lock.ManagerOptions(manager.Options{}); err != nil {
		t.Fatal(err)
	}
	if leader, token := gauges(t, ns, "a"); leader != 1 || token != float64(first) {
		t.Fatalf("a's gauges while it leads: leader %v, token %v (term %d)", leader, token, first)
	}
	b := startCandidate(t, cfg, admin, ns, "b")
	b.queued(t, admin, ns)

	revoked := time.Now()
	claim, err := claimOf(admin, ns, "a")
	if err != nil {
		t.Fatal(err)
	}
	if got := a.lock.Claim(); got != claim.Name {
		t.Fatalf("a's lock names claim %q, the lease %q", got, claim.Name)
	}
	ctx, cancel := testenv.Call()
	defer cancel()
	if err := admin.Delete(ctx, claim); err != nil {
		t.Fatal(err)
	}
	second := b.leads(t, 20*time.Second)
	if second <= first {
		t.Fatalf("b leads with %d after a's %d", second, first)
	}
	a.next(t, "stopped", 10*time.Second)
	t.Logf("MEASURED a's elector stopped %v after its claim was deleted (window %v)", time.Since(revoked), a.lock.Timing().RenewDeadline+2*a.lock.Timing().RetryPeriod)
	if _, err := a.lock.Token(); !errors.Is(err, lease.ErrLost) {
		t.Fatalf("a's token after the loss: %v", err)
	}
	if leader, token := gauges(t, ns, "a"); leader != 0 || token != 0 {
		t.Fatalf("a's gauges after the loss: leader %v, token %v", leader, token)
	}
	testenv.Eventually(t, "a's lock names no claim between terms", 10*time.Second, func() error {
		if got := a.lock.Claim(); got != "" {
			return fmt.Errorf("claim %q", got)
		}
		return nil
	})
	stale := fence.NewClient(admin, leaseName, fixed(first))
	err = stale.Update(ctx, ledger(t, admin, ns))
	if !errors.Is(err, fence.ErrFenced) {
		t.Fatalf("a write with a's first token: %v", err)
	}
	// a's refused write, reported through its lock: one WriteRefused Event on the lease.
	if got := a.lock.Refusal(err); got != lease.NewerHolder {
		t.Fatalf("a's lock calls its refused write %v", got)
	}
	a.lock.Reported(ctx)
	var events eventsv1.EventList
	if err := admin.List(ctx, &events, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	reports := 0
	for _, e := range events.Items {
		if e.Reason == lease.WriteRefusedReason && e.Regarding.Name == leaseName {
			reports++
		}
	}
	if reports != 1 {
		t.Fatalf("%d WriteRefused Events on the lease after a's refused write, want 1", reports)
	}

	b.halt()
	third := a.leads(t, 20*time.Second)
	if third <= second {
		t.Fatalf("a leads again with %d after b's %d", third, second)
	}
	if got := ledger(t, admin, ns); got.Data["writer"] != "a" {
		t.Fatalf("ledger written last by %s", got.Data["writer"])
	} else if tok, _ := fence.TokenOf(got); tok != third {
		t.Fatalf("ledger carries %d, a's second term is %d", tok, third)
	}
	select {
	case e := <-a.events:
		t.Fatalf("a, leading again: %s", e)
	default:
	}
}

// The elector leads as soon as its claim is granted, not at its next RetryPeriod: four
// hand-overs in a row on a 15 s lease (RetryPeriod about 1.06 s, client-go sleeping 1.06 to
// 2.3 s between attempts) each take well under one attempt's sleep. Without Get waiting for
// the grant, a hand-over falls anywhere in that sleep (below 500 ms about one time in three).
func TestAHandOverIsNotPacedByTheRetryPeriod(t *testing.T) {
	cfg := testenv.Config(t)
	admin := testenv.Client(t, cfg)
	ns := testenv.Namespace(t, admin, "go-lock-handover")
	testenv.StartOperator(t, ns)
	testenv.CreateLease(t, admin, ns, leaseName, 15)

	leader := startCandidate(t, cfg, admin, ns, "c0")
	leader.leads(t, 60*time.Second)
	for i := 1; i <= 4; i++ {
		next := startCandidate(t, cfg, admin, ns, fmt.Sprintf("c%d", i))
		next.queued(t, admin, ns)
		if retry := next.lock.Timing().RetryPeriod; retry < time.Second {
			t.Fatalf("RetryPeriod %v: the test needs a lease whose RetryPeriod is at least 1 s", retry)
		}
		released := time.Now()
		leader.halt()
		next.leads(t, 20*time.Second)
		took := time.Duration(next.ledAt.Load() - released.UnixNano())
		t.Logf("MEASURED hand-over %d: %v from the release to the next elector leading", i, took)
		if took > 500*time.Millisecond {
			t.Fatalf("hand-over %d took %v: the elector waited for its next attempt", i, took)
		}
		leader = next
	}
}

// queued waits until the candidate's claim exists: it is in the lease's queue.
func (c *candidate) queued(t *testing.T, admin client.Client, ns string) {
	t.Helper()
	testenv.Eventually(t, c.name+"'s claim queued", 10*time.Second, func() error {
		_, err := claimOf(admin, ns, c.name)
		return err
	})
}

func claimOf(c client.Client, ns, identity string) (*v1alpha1.FencedLeaseClaim, error) {
	ctx, cancel := testenv.Call()
	defer cancel()
	list := &v1alpha1.FencedLeaseClaimList{}
	if err := c.List(ctx, list, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	for i := range list.Items {
		if list.Items[i].Spec.HolderIdentity == identity && list.Items[i].DeletionTimestamp == nil {
			return &list.Items[i], nil
		}
	}
	return nil, fmt.Errorf("no claim of %s", identity)
}

func ledger(t *testing.T, c client.Client, ns string) *corev1.ConfigMap {
	t.Helper()
	ctx, cancel := testenv.Call()
	defer cancel()
	got := &corev1.ConfigMap{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "ledger"}, got); err != nil {
		t.Fatal(err)
	}
	return got
}

// gauges are the lock's fencedlease_leader and fencedlease_token for identity, as
// controller-runtime's registry serves them.
func gauges(t *testing.T, ns, identity string) (leader, token float64) {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, f := range families {
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["lease"] != ns+"/"+leaseName || labels["identity"] != identity {
				continue
			}
			switch f.GetName() {
			case "fencedlease_leader":
				leader, found = m.GetGauge().GetValue(), found+1
			case "fencedlease_token":
				token, found = m.GetGauge().GetValue(), found+1
			}
		}
	}
	if found != 2 {
		t.Fatalf("%d of the lock's gauges in controller-runtime's registry", found)
	}
	return leader, token
}

// ManagerOptions refuses a manager timing other than the lock's, and sets the lock's.
func TestManagerOptionsRefuseAnotherTiming(t *testing.T) {
	cfg := testenv.Config(t)
	admin := testenv.Client(t, cfg)
	ns := testenv.Namespace(t, admin, "go-lock-options")
	testenv.CreateLease(t, admin, ns, leaseName, 15)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := lock.New(ctx, cfg, lock.Config{Namespace: ns, Name: leaseName, Timing: lock.Timing{
		LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second,
	}}); err == nil {
		t.Fatal("client-go's default timing accepted for a 15 s FencedLease")
	}
	lk, err := lock.New(ctx, cfg, lock.Config{Namespace: ns, Name: leaseName})
	if err != nil {
		t.Fatal(err)
	}
	renew := 10 * time.Second
	if _, err := lk.ManagerOptions(manager.Options{RenewDeadline: &renew}); err == nil {
		t.Fatal("a manager RenewDeadline of 10 s accepted")
	}
	o, err := lk.ManagerOptions(manager.Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := lock.DefaultTiming(15*time.Second, 0)
	if !o.LeaderElection || o.LeaderElectionResourceLockInterface != lk || *o.RenewDeadline != want.RenewDeadline ||
		*o.RetryPeriod != want.RetryPeriod || *o.LeaseDuration != want.LeaseDuration || !o.LeaderElectionReleaseOnCancel {
		t.Fatalf("options %+v", o)
	}
	if _, err := lock.TokensFrom(o.BaseContext()).Token(); !errors.Is(err, lease.ErrLost) {
		t.Fatalf("the base context's token source before any term: %v", err)
	}
}

// spy is a Lock that reports, when the elector steps down (releases), how long its term
// still had before the local safe deadline.
type spy struct {
	*lock.Lock
	steppedDown chan time.Duration
}

func (s spy) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	if ler.HolderIdentity == "" {
		s.steppedDown <- s.TimeLeft()
	}
	return s.Lock.Update(ctx, ler)
}

// I6 through client-go's elector: a leader cut off from the apiserver stops believing it
// leads (its elector steps down) while its term is still inside the local safe deadline,
// not after it.
func TestACutOffLeaderStepsDownBeforeItsDeadline(t *testing.T) {
	cfg := testenv.Config(t)
	admin := testenv.Client(t, cfg)
	ns := testenv.Namespace(t, admin, "go-lock-cut")
	testenv.StartOperator(t, ns)
	testenv.CreateLease(t, admin, ns, leaseName, 6)
	proxy, through := testenv.NewProxy(t, cfg)
	ctx, stop := context.WithCancel(context.Background())
	lk, err := lock.New(ctx, through, lock.Config{Namespace: ns, Name: leaseName, Identity: "a"})
	if err != nil {
		t.Fatal(err)
	}
	s := spy{Lock: lk, steppedDown: make(chan time.Duration, 10)}
	led := make(chan struct{})
	conf := lk.LeaderElectionConfig(leaderelection.LeaderCallbacks{
		OnStartedLeading: func(context.Context) { close(led) },
		OnStoppedLeading: func() { s.steppedDown <- lk.TimeLeft() }, // if it stopped without releasing
	})
	conf.Lock = s
	le, err := leaderelection.NewLeaderElector(conf)
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan struct{})
	go func() { defer close(ran); le.Run(ctx) }()
	defer func() { proxy.Heal(); stop(); <-ran; <-lk.Done() }()
	select {
	case <-led:
	case <-time.After(60 * time.Second):
		t.Fatal("not leading within 60 s")
	}
	time.Sleep(time.Second)
	proxy.Cut()
	cut := time.Now()
	select {
	case left := <-s.steppedDown:
		t.Logf("MEASURED the cut-off elector stepped down %v after the cut, %v before the local safe deadline (timing %+v)", time.Since(cut), left, lk.Timing())
		if left <= 0 {
			t.Fatal("the elector stepped down at or after the local safe deadline")
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the cut-off elector did not step down within 15 s")
	}
}

type fixed int64

func (f fixed) Token() (int64, error) { return int64(f), nil }

// A lone candidate whose claim is revoked is granted again at once if it queues at once;
// the lock waits until the elector has seen the loss, so the first term's work never runs on
// into the second: "stopped" comes before the next "leading", with a new token.
func TestTheElectorSeesTheLossBeforeTheNextTerm(t *testing.T) {
	cfg := testenv.Config(t)
	admin := testenv.Client(t, cfg)
	ns := testenv.Namespace(t, admin, "go-lock-alone")
	testenv.StartOperator(t, ns)
	testenv.CreateLease(t, admin, ns, leaseName, 3)

	a := startCandidate(t, cfg, admin, ns, "a")
	first := a.leads(t, 60*time.Second)
	claim, err := claimOf(admin, ns, "a")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := testenv.Call()
	defer cancel()
	if err := admin.Delete(ctx, claim); err != nil {
		t.Fatal(err)
	}
	a.next(t, "stopped", 10*time.Second)
	if second := a.leads(t, 20*time.Second); second <= first {
		t.Fatalf("a leads again with %d after %d", second, first)
	}
	a.halt()
	for _, pkg := range []string{"github.com/fenced-lease/fenced-lease/go/lock", "github.com/fenced-lease/fenced-lease/go/lease"} {
		testenv.NoGoroutinesOf(t, pkg, 5*time.Second)
	}
	if _, err := claimOf(admin, ns, "a"); err == nil {
		t.Fatal("a's claim is left after its lock's context ended")
	}
}
