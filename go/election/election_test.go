package election_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fenced-lease/fenced-lease/go/api/v1alpha1"
	"github.com/fenced-lease/fenced-lease/go/election"
	"github.com/fenced-lease/fenced-lease/go/internal/testenv"
	"github.com/fenced-lease/fenced-lease/go/lease"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// term is one term of one candidate, as its callbacks saw it.
type term struct {
	who            string
	token          int64
	started, ended time.Time
}

// candidate runs an elector and records its terms and the leaders it was told of.
type candidate struct {
	name    string
	le      *election.LeaderElector
	mu      sync.Mutex
	terms   []term
	leaders []string
	stopped int
	cancel  context.CancelFunc
	done    chan error
	once    sync.Once
}

func start(t *testing.T, cfg *rest.Config, ns, name string) *candidate {
	t.Helper()
	c, err := lease.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cd := &candidate{name: name, done: make(chan error, 1)}
	cd.le, err = election.NewLeaderElector(election.LeaderElectionConfig{
		Client: c, Namespace: ns, Name: "leader", Identity: name,
		Callbacks: election.LeaderCallbacks{
			OnStartedLeading: cd.lead,
			OnStoppedLeading: func() { cd.mu.Lock(); cd.stopped++; cd.mu.Unlock() },
			OnNewLeader:      func(id string) { cd.mu.Lock(); cd.leaders = append(cd.leaders, id); cd.mu.Unlock() },
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cd.cancel = cancel
	go func() { cd.done <- cd.le.Run(ctx) }()
	t.Cleanup(func() { cd.stop(t) })
	return cd
}

func (cd *candidate) lead(ctx context.Context, token int64) {
	cd.mu.Lock()
	i := len(cd.terms)
	cd.terms = append(cd.terms, term{who: cd.name, token: token, started: time.Now()})
	cd.mu.Unlock()
	<-ctx.Done()
	cd.mu.Lock()
	cd.terms[i].ended = time.Now()
	cd.mu.Unlock()
}

func (cd *candidate) stop(t *testing.T) {
	cd.once.Do(func() {
		cd.cancel()
		select {
		case err := <-cd.done:
			if err != nil {
				t.Errorf("%s: Run: %v", cd.name, err)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("%s: Run did not return", cd.name)
		}
	})
}

func (cd *candidate) snapshot() ([]term, []string, int) {
	cd.mu.Lock()
	defer cd.mu.Unlock()
	return append([]term(nil), cd.terms...), append([]string(nil), cd.leaders...), cd.stopped
}

// termNumber waits until cd has started its n-th term (1-based) and returns it.
func (cd *candidate) termNumber(t *testing.T, n int) term {
	t.Helper()
	var got term
	testenv.Eventually(t, fmt.Sprintf("%s to lead a term #%d", cd.name, n), 30*time.Second, func() error {
		terms, _, _ := cd.snapshot()
		if len(terms) < n {
			return fmt.Errorf("%d term(s)", len(terms))
		}
		got = terms[n-1]
		return nil
	})
	return got
}

func setup(t *testing.T, prefix string, seconds int32) (*rest.Config, client.Client, string) {
	cfg := testenv.Config(t)
	admin := testenv.Client(t, cfg)
	ns := testenv.Namespace(t, admin, prefix)
	testenv.StartOperator(t, ns)
	testenv.CreateLease(t, admin, ns, "leader", seconds)
	return cfg, admin, ns
}

// Leaders take turns with growing tokens; a candidate that lost campaigns again and leads
// again; OnNewLeader follows the holder; OnStoppedLeading follows every term.
func TestLeadersTakeTurnsAndTheLoserCampaignsAgain(t *testing.T) {
	cfg, admin, ns := setup(t, "go-elect", 15)
	a := start(t, cfg, ns, "a")
	first := a.termNumber(t, 1)
	b := start(t, cfg, ns, "b")
	testenv.Eventually(t, "b to be told a leads", 10*time.Second, func() error {
		if b.le.GetLeader() != "a" || b.le.IsLeader() {
			return fmt.Errorf("b sees %q", b.le.GetLeader())
		}
		return nil
	})
	// b's claim queues behind a's before a loses: a candidate that lost campaigns again at
	// once, and a claim of a's made before b's would be granted first. So would one made in
	// the same second: the API keeps creation times in whole seconds, and the operator breaks
	// ties by name.
	var bCreated time.Time
	testenv.Eventually(t, "b's claim to queue", 10*time.Second, func() error {
		call, cancel := testenv.Call()
		defer cancel()
		var claims v1alpha1.FencedLeaseClaimList
		if err := admin.List(call, &claims, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, c := range claims.Items {
			if c.Spec.HolderIdentity == "b" && c.Status != nil && c.Status.Phase == v1alpha1.ClaimPending {
				bCreated = c.CreationTimestamp.Time
				return nil
			}
		}
		return errors.New("no Pending claim of b")
	})
	testenv.Eventually(t, "the second after b's claim was created", 3*time.Second, func() error {
		if !time.Now().After(bCreated.Add(time.Second)) {
			return errors.New("still in the second of b's claim")
		}
		return nil
	})
	// a loses its lease: its claim is deleted (as an admin cleaning up would).
	var claims v1alpha1.FencedLeaseClaimList
	call, cancel := testenv.Call()
	defer cancel()
	if err := admin.List(call, &claims, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for i := range claims.Items {
		if claims.Items[i].Spec.HolderIdentity == "a" {
			if err := admin.Delete(call, &claims.Items[i]); err != nil {
				t.Fatal(err)
			}
		}
	}
	second := b.termNumber(t, 1)
	if second.token <= first.token {
		t.Fatalf("b's token %d is not above a's %d", second.token, first.token)
	}
	testenv.Eventually(t, "a's term to end and a to campaign again", 10*time.Second, func() error {
		terms, _, stopped := a.snapshot()
		if terms[0].ended.IsZero() || stopped != 1 || a.le.IsLeader() {
			return fmt.Errorf("a: ended %v, stopped %d", terms[0].ended, stopped)
		}
		return nil
	})
	b.stop(t) // b shuts down: releases at once
	third := a.termNumber(t, 2)
	if third.token <= second.token {
		t.Fatalf("a's second token %d is not above b's %d", third.token, second.token)
	}
	// OnNewLeader follows the lease's holder through a watch of its own, so it may tell a of
	// its own lead a moment after its term began.
	testenv.Eventually(t, "OnNewLeader to tell a of b, then of itself", 10*time.Second, func() error {
		_, leaders, _ := a.snapshot()
		if !contains(leaders, "b") || leaders[len(leaders)-1] != "a" {
			return fmt.Errorf("OnNewLeader told a %q", leaders)
		}
		return nil
	})
}

// The leading context ends at the local safe deadline: a leader cut off from the apiserver
// stops leading before the other candidate starts.
func TestTheLeadingContextEndsBeforeAnotherLeaderStarts(t *testing.T) {
	cfg, _, ns := setup(t, "go-elect-cut", 3)
	proxy, through := testenv.NewProxy(t, cfg)
	a := start(t, through, ns, "a")
	a.termNumber(t, 1)
	b := start(t, cfg, ns, "b")
	time.Sleep(500 * time.Millisecond) // b queues
	proxy.Cut()
	next := b.termNumber(t, 1)
	terms, _, _ := a.snapshot()
	if terms[0].ended.IsZero() || !terms[0].ended.Before(next.started) {
		t.Fatalf("a's term ended at %v, b's started at %v", terms[0].ended, next.started)
	}
	t.Logf("MEASURED cut-off leader stopped %v before the next one started", next.started.Sub(terms[0].ended))
	proxy.Heal()
	a.stop(t)
	b.stop(t)
	testenv.NoGoroutinesOf(t, "github.com/fenced-lease/fenced-lease/go/election", 5*time.Second)
	testenv.NoGoroutinesOf(t, "github.com/fenced-lease/fenced-lease/go/lease", 5*time.Second)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
