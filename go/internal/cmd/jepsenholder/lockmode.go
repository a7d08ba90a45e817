package main

// The lock mode (-mode=lock): the lease held through package lock, as controller-runtime's
// manager holds it. One lock.Lock for the process (as one manager per process); each round
// runs client-go's leaderelection.RunOrDie on it with the lock's own LeaderElectionConfig
// (its Timing, fitted to the lease's duration: see go/lock/doc.go; ReleaseOnCancel). The
// work starts in OnStartedLeading and asks the Lock (its TokenSource) before every write and
// every few milliseconds besides, like the lease mode; it stops when the leading context
// ends, and its events are recorded before the round's end is (released, or lost: the
// elector stopped leading although the holder did not let go). Letting go is cancelling the
// elector's context (it releases: the lock deletes the claim), now and then followed by the
// stale writes of a zombie. After a loss the process leaves half the time, as
// controller-runtime's manager does (the runner starts a new one), and otherwise leads again
// with a new elector on the same Lock.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fenced-lease/fenced-lease/go/lease"
	"github.com/fenced-lease/fenced-lease/go/lock"
	"github.com/go-logr/logr/funcr"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// errLeadershipLost ends a process whose elector lost leadership, as controller-runtime's
// manager returns from Start.
var errLeadershipLost = errors.New("leader election lost")

// runLock holds the lease through a lock.Lock until ctx ends (or leadership is lost and the
// process leaves).
func (h *holder) runLock(ctx context.Context, config *rest.Config) error {
	ctrllog.SetLogger(funcr.New(func(prefix, args string) {
		fmt.Fprintln(os.Stderr, prefix, args)
	}, funcr.Options{}))
	lockCtx, stop := context.WithCancel(ctx)
	var lk *lock.Lock
	for lk == nil {
		var err error
		lk, err = lock.New(lockCtx, config, lock.Config{Namespace: h.s.namespace, Name: h.s.lease, Identity: h.s.process})
		if err != nil {
			if ctx.Err() != nil {
				stop()
				return nil
			}
			// The lease may be gone for a moment (deleted and created again): try again.
			fmt.Fprintln(os.Stderr, "jepsenholder: lock.New:", err)
			sleep(ctx, h.between(200, 1000))
		}
	}
	defer func() { // the claim deleted before the process leaves
		stop()
		select {
		case <-lk.Done():
		case <-time.After(10 * time.Second):
		}
	}()
	for ctx.Err() == nil {
		if h.elect(ctx, lk) && h.rng.IntN(2) == 0 {
			return errLeadershipLost
		}
	}
	return nil
}

// lockTokens is the Lock as the holder asks it: it remembers, for the lost event, where the
// local safe deadline was at the last Ok (a lower bound: a renew after it moves it on) and
// the first failure.
type lockTokens struct {
	lk       *lock.Lock
	mu       sync.Mutex
	deadline uint64 // monotonic instant of the local safe deadline (0: no Ok yet)
	lost     *lease.LostError
	lostAt   uint64
}

func (t *lockTokens) Token() (int64, error) {
	token, err := t.lk.Token()
	now := monotonic()
	if err == nil {
		// now is before TimeLeft's own reading: now + left is not after the deadline.
		if left := t.lk.TimeLeft(); left > 0 {
			t.mu.Lock()
			t.deadline = now + uint64(left)
			t.mu.Unlock()
		}
		return token, nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.lost == nil {
		var lost *lease.LostError
		if !errors.As(err, &lost) {
			lost = &lease.LostError{Lease: t.lk.Describe(), Reason: lease.NotGranted, Detail: err.Error()}
		}
		t.lost, t.lostAt = lost, now
	}
	return 0, err
}

// term is the claim and token of the term held, read so that both are of the same term.
func (t *lockTokens) term() (string, int64, error) {
	for {
		claim := t.lk.Claim()
		token, err := t.Token()
		if err != nil {
			return claim, 0, err
		}
		if again := t.lk.Claim(); again == claim && claim != "" {
			return claim, token, nil
		}
	}
}

// lockLoss is how the Lock stopped answering for a term: why, when (first seen), and how far
// the local safe deadline then still was (a lower bound; 0 unknown).
type lockLoss struct {
	why        lease.LostReason
	at         uint64
	deadlineIn int64
	answers    bool // the Lock still answers Ok: the elector stopped first
}

// loss is how the Lock stopped answering for the term (asking it once more: a loss not yet
// seen by the work is seen now).
func (t *lockTokens) loss() lockLoss {
	_, _ = t.Token()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.lost == nil {
		return lockLoss{answers: true, at: monotonic()}
	}
	l := lockLoss{why: t.lost.Reason, at: t.lostAt}
	if t.deadline > 0 {
		l.deadlineIn = int64(t.deadline) - int64(t.lostAt)
	}
	return l
}

// event is the lost event of claim's term: the operator ended it (by_operator) when it
// expired the claim or named another holder.
func (l lockLoss) event(name, claim string) event {
	reason := l.why.String()
	switch {
	case l.answers:
		reason = "the elector stopped leading while the lock still answered"
	case l.why == lease.Released:
		reason = "the elector stopped leading; the lock then released the term"
	}
	return event{
		"ev": "lost", "lease": name, "claim": claim, "reason": reason,
		"by_operator": !l.answers && (l.why == lease.Expired || l.why == lease.Superseded), "deadline_in": l.deadlineIn,
	}
}

// leadOutcome is how a term the elector led ended, as the work saw it.
type leadOutcome struct {
	claim    string
	token    int64
	acquired bool // the work got the term's token and recorded it
	// letGo: the holder let go (cancelled the elector's context); zombie: and writes its
	// old token once the lease has moved on.
	letGo, zombie bool
}

// elect is one round: an elector on lk until it has led one term and stopped, or ctx ends.
// Reports whether leadership was lost (the elector stopped leading, not told to).
func (h *holder) elect(ctx context.Context, lk *lock.Lock) bool {
	name := h.s.lease
	h.rec.record(event{"ev": "waiting", "lease": name})
	electCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	tokens := &lockTokens{lk: lk}
	var stopped atomic.Uint64 // when the run told the process to stop
	defer context.AfterFunc(ctx, func() { stopped.Store(monotonic()) })()
	led := make(chan leadOutcome, 1)
	callbacks := leaderelection.LeaderCallbacks{
		OnStartedLeading: func(lead context.Context) { led <- h.lead(lead, cancel, tokens) },
		OnStoppedLeading: func() {},
	}
	leaderelection.RunOrDie(electCtx, lk.LeaderElectionConfig(callbacks))

	out, ok := ledOutcome(electCtx, led)
	if !ok || !out.acquired {
		return false
	}
	// Lost: the elector stopped leading although the holder did not let go, and the run did
	// not stop it first (then the elector releases: the Lock fails with Released, or no term).
	loss := tokens.loss()
	stop := stopped.Load()
	stoppedFirst := ctx.Err() != nil &&
		(loss.answers || loss.why == lease.Released || loss.why == lease.NotGranted || (stop != 0 && loss.at >= stop))
	if !out.letGo && !stoppedFirst {
		h.rec.record(loss.event(name, out.claim))
		return true
	}
	h.released(ctx, out)
	return false
}

// ledOutcome is the outcome of the term an elector on electCtx led, once the elector has
// stopped. It returns without leading only once its context ends; then it may have led, and
// its work ends with the leading context (a write in flight last). False: it did not lead.
func ledOutcome(electCtx context.Context, led <-chan leadOutcome) (leadOutcome, bool) {
	if electCtx.Err() == nil {
		return <-led, true
	}
	select {
	case out := <-led:
		return out, true
	case <-time.After(writeTimeout + time.Second):
		return leadOutcome{}, false
	}
}

// released records that the holder let go of out's term, then writes as a zombie, or pauses
// before the next round.
func (h *holder) released(ctx context.Context, out leadOutcome) {
	h.rec.record(event{"ev": "released", "lease": h.s.lease, "claim": out.claim, "how": "released"})
	if out.zombie {
		h.zombie(ctx, out.token)
	} else {
		sleep(ctx, h.between(0, 400))
	}
}

// lead is the work of one term, from OnStartedLeading: it records the grant, writes (asking
// the Lock before each write) until its hold is over, the Lock fails, a fence refuses or
// leadership ends; then, if it still holds, lets go by cancelling the elector's context.
// It returns once the leading context has ended: nothing is written after.
func (h *holder) lead(lead context.Context, release context.CancelFunc, tokens *lockTokens) leadOutcome {
	defer func() { <-lead.Done() }()
	claim, token, err := tokens.term()
	if err != nil {
		// Led, but the term is over already: nothing to do until the elector sees it.
		h.rec.record(event{"ev": "token-err", "lease": h.s.lease, "claim": claim, "called": monotonic(), "reason": err.Error()})
		return leadOutcome{}
	}
	h.rec.record(event{"ev": "acquired", "lease": h.s.lease, "claim": claim, "token": token})
	out := leadOutcome{claim: claim, token: token, acquired: true}
	term := held{tokens: tokens, claim: claim}
	probe := h.probe(lead, term)
	lost := h.write(lead, term, h.hold())
	probe()
	if lost || lead.Err() != nil {
		return out
	}
	if _, err := tokens.Token(); err != nil {
		return out
	}
	out.letGo = true
	out.zombie = h.rng.IntN(8) <= 1
	release()
	return out
}
