package lease

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/fenced-lease/fenced-lease/go/api/v1alpha1"
	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
)

// keeper keeps one claim alive: heartbeats it every third of the duration in force, watches
// the claim and the lease, and ends the hold at the local safe deadline from a timer of its
// own. All state changes go through the pure tracker. When the hold ends (lost or released)
// its goroutines stop and the claim is deleted, so that the next waiter is granted at once.
type keeper struct {
	client                  *Client
	log                     logr.Logger
	namespace, lease, claim string
	identity                string
	reports                 *reporter // the refusals of this holder's writes (Lease.Refusal)

	mu      sync.Mutex
	t       tracker
	changed chan struct{} // closed and replaced on every change of t

	ctx    context.Context // done once the hold has ended
	cancel context.CancelFunc
	wg     sync.WaitGroup // the goroutines that keep the claim

	finished  chan struct{} // closed once the claim is deleted (or could not be)
	deleteErr error         // set before finished is closed

	// The claim as created and the lease as acquire read it: the watches start from their
	// resourceVersions rather than from reads of their own, two round trips less between
	// the create and the grant.
	seedClaim, seedLease runtime.Object
}

// startKeeper starts keeping created, a claim whose first heartbeat (the create) was sent at
// firstSent; read is the lease as acquire read it meanwhile (nil: the keeper reads it).
func startKeeper(c *Client, log logr.Logger, ns, lease, identity string, t *tracker, firstSent bootInstant, created *v1alpha1.FencedLeaseClaim, read *v1alpha1.FencedLease) *keeper {
	t.heartbeatOK(firstSent, bootNow(), viewClaim(created))
	var seedLease runtime.Object // not a typed nil
	if read != nil {
		seedLease = read
	}
	ctx, cancel := context.WithCancel(context.Background())
	k := &keeper{
		client: c, log: log.WithValues("lease", ns+"/"+lease, "claim", t.claim),
		namespace: ns, lease: lease, claim: t.claim, identity: identity,
		t: *t, changed: make(chan struct{}),
		ctx: ctx, cancel: cancel, finished: make(chan struct{}),
		seedClaim: created, seedLease: seedLease,
		reports: newReporter(c.events, ns, lease, reportingInstance(created, identity), t.timing().callTimeout),
	}
	if !k.t.live() {
		cancel()
	}
	k.wg.Add(4)
	go k.heartbeat()
	go k.followClaim()
	go k.followLease()
	go k.deadlineTimer()
	go k.finish()
	return k
}

// update applies change to the tracker; wakes waiters if it changed, stops the goroutines if
// the hold ended.
func (k *keeper) update(change func(*tracker) bool) {
	k.mu.Lock()
	if change(&k.t) {
		close(k.changed)
		k.changed = make(chan struct{})
	}
	live := k.t.live()
	k.mu.Unlock()
	if !live {
		k.cancel()
	}
}

// snapshot is a copy of the tracker, and a channel closed at its next change.
func (k *keeper) snapshot() (tracker, <-chan struct{}) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.t, k.changed
}

func (k *keeper) timing() timing {
	t, _ := k.snapshot()
	return t.timing()
}

// checkDeadline ends the hold at once if its deadline has passed at now (a reader noticed
// before the timer did, e.g. right after the process was resumed from a pause).
func (k *keeper) checkDeadline(now bootInstant) {
	k.update(func(t *tracker) bool { return t.checkDeadline(now) })
}

// end ends the hold for reason (if still live).
func (k *keeper) end(reason LostReason, detail string) {
	k.update(func(t *tracker) bool { return t.end(reason, detail) })
}

// finish waits for the hold to end, deletes the claim (at once: the tracker already refuses
// the token, so nothing waits for the other goroutines to stop), then waits for them.
// Deleting it happens here, not in the caller, so that it completes whoever stops waiting.
func (k *keeper) finish() {
	<-k.ctx.Done()
	k.deleteErr = k.deleteClaim()
	k.wg.Wait()
	if k.deleteErr != nil {
		k.log.Info("could not delete claim; it expires instead", "error", k.deleteErr.Error())
	}
	close(k.finished)
}

// discard ends the hold and waits (at most until ctx is done) for the claim's deletion.
func (k *keeper) discard(ctx context.Context, reason LostReason) error {
	k.end(reason, "")
	select {
	case <-k.finished:
		return k.deleteErr
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

func (k *keeper) deleteClaim() error {
	tm := k.timing()
	ctx, cancel := context.WithTimeout(context.Background(), tm.callTimeout)
	defer cancel()
	err := k.client.deleteClaim(ctx, k.namespace, k.claim)
	if err == nil || apierrors.IsNotFound(err) {
		return nil
	}
	if ctx.Err() != nil {
		return timedOut("delete FencedLeaseClaim", tm.callTimeout)
	}
	return fromAPI("delete FencedLeaseClaim "+k.claim, err)
}

// deadlineTimer ends the hold at the deadline, whether or not any other goroutine runs.
func (k *keeper) deadlineTimer() {
	defer k.wg.Done()
	for {
		t, changed := k.snapshot()
		if !t.live() {
			return
		}
		wait := time.Duration(-1) // waiting: nothing held, no deadline to watch
		if t.holding() {
			wait = min(t.deadline().since(bootNow()), recheck)
		}
		if !k.waitChange(changed, wait) {
			return
		}
		k.checkDeadline(bootNow())
	}
}

// waitChange waits for changed, or for d when d >= 0; false if the hold ends first.
func (k *keeper) waitChange(changed <-chan struct{}, d time.Duration) bool {
	var wake <-chan time.Time
	if d >= 0 {
		timer := time.NewTimer(d)
		defer timer.Stop()
		wake = timer.C
	}
	select {
	case <-k.ctx.Done():
		return false
	case <-changed:
	case <-wake:
	}
	return true
}

func randFloat() float64 { return rand.Float64() }
