package main

// The follow mode (-mode=follow -follow=NAME): a controller that elects with client-go's own
// leaderelection package on coordination Lease NAME (a resourcelock.LeaseLock, its pod's name
// as identity), as controllers built on client-go or controller-runtime do: nothing of
// fenced-lease decides when it writes. The run's FencedLease (JEPSEN_LEASE) follows that
// Lease (spec.follow), so the operator names the Lease's holder pod in its status and grants
// it a token. The holder learns its term's token from that status (a watch) and, while
// client-go says it leads, writes: the token to the resources that order writes by token, and
// unstamped to the DaemonSet the lease fences by kind. It asks nothing before a write: a
// leader paused past its lease wakes and writes on until its elector notices, and only the
// fences stop those writes. Letting go is cancelling the elector's context (it releases the
// Lease), now and then followed by a zombie's writes; after leadership is lost the process
// leaves half the time (the runner starts a new one, a new pod), as a manager does.

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/fenced-lease/fenced-lease/go/api/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// followRounds is the order a follow holder writes in: the token-ordered resources and the
// workload its lease fences by kind.
var followRounds = []resource{kubeObject, postgresRow, redisKey, workload}

// claimOf names a holder as the history does: its claim, or for the holder of a followed
// Lease (no claim) its identity and the Lease's transitions, `<identity>@<transitions>`
// (tests/safety/jepsen/worker.rs spells it the same way).
func claimOf(h *v1alpha1.LeaseHolder) string {
	if h.Claim == "" && h.Lease != nil {
		return fmt.Sprintf("%s@%d", h.Identity, h.Lease.LeaseTransitions)
	}
	return h.Claim
}

// statusWatch keeps the latest status of the FencedLease, as a watch delivers it.
type statusWatch struct {
	mu      sync.Mutex
	holder  *v1alpha1.LeaseHolder
	token   int64
	changed chan struct{} // closed on every update
}

func newStatusWatch() *statusWatch { return &statusWatch{changed: make(chan struct{})} }

func (w *statusWatch) set(holder *v1alpha1.LeaseHolder, token int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.holder, w.token = holder, token
	close(w.changed)
	w.changed = make(chan struct{})
}

// run watches FencedLease name of namespace until ctx ends, watching again after any error
// (a watch without a resourceVersion starts with the object as it is).
func (w *statusWatch) run(ctx context.Context, api client.WithWatch, namespace, name string) {
	for ctx.Err() == nil {
		watcher, err := api.Watch(ctx, &v1alpha1.FencedLeaseList{}, client.InNamespace(namespace), client.MatchingFields{"metadata.name": name})
		if err != nil {
			sleep(ctx, 200*time.Millisecond)
			continue
		}
		for ev := range watcher.ResultChan() {
			l, ok := ev.Object.(*v1alpha1.FencedLease)
			switch {
			case ev.Type == watch.Deleted:
				w.set(nil, 0)
			case ok && (ev.Type == watch.Added || ev.Type == watch.Modified) && l.Status == nil:
				w.set(nil, 0) // created again, no status yet
			case ok && (ev.Type == watch.Added || ev.Type == watch.Modified):
				w.set(l.Status.Holder, l.Status.FencingToken)
			}
		}
		watcher.Stop()
		sleep(ctx, 100*time.Millisecond)
	}
}

// term is a grant of the FencedLease to pod uid: its token and claim, and the followed
// Lease's term it was taken from.
type term struct {
	token       int64
	claim       string
	leaseUID    string
	transitions int64
}

// mine is the grant the status names now, if it names pod uid.
func (w *statusWatch) mine(uid string) (term, bool, <-chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	h := w.holder
	if h == nil || h.PodUID == nil || *h.PodUID != uid || h.Lease == nil {
		return term{}, false, w.changed
	}
	return term{token: w.token, claim: claimOf(h), leaseUID: h.Lease.UID, transitions: h.Lease.LeaseTransitions}, true, w.changed
}

// follower is what follow mode adds to the holder: the Lease lock, its clients, the status
// watch and the pod it runs as.
type follower struct {
	lock   *resourcelock.LeaseLock
	kube   kubernetes.Interface
	status *statusWatch
	podUID string
	timing leaderelection.LeaderElectionConfig // LeaseDuration, RenewDeadline, RetryPeriod
}

// runFollow elects on Lease followed until ctx ends (or leadership is lost and the process
// leaves).
func (h *holder) runFollow(ctx context.Context, config *rest.Config, followed string) error {
	podUID := os.Getenv("POD_UID")
	if podUID == "" {
		return fmt.Errorf("-mode=follow needs POD_UID: the pod the process runs as")
	}
	kube, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	api, err := client.NewWithWatch(config, client.Options{Scheme: h.res.api.Scheme()})
	if err != nil {
		return err
	}
	f := &follower{
		lock: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: h.s.namespace, Name: followed},
			Client:     kube.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: h.s.process},
		},
		kube: kube, status: newStatusWatch(), podUID: podUID,
		// client-go's rules: LeaseDuration > RenewDeadline > 1.2 × RetryPeriod.
		timing: leaderelection.LeaderElectionConfig{
			LeaseDuration: h.s.term, RenewDeadline: h.s.term * 2 / 3, RetryPeriod: h.s.term / 6,
		},
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go f.status.run(watchCtx, api, h.s.namespace, h.s.lease)
	for ctx.Err() == nil {
		if h.follow(ctx, f) && h.rng.IntN(2) == 0 {
			return errLeadershipLost
		}
	}
	return nil
}

// follow is one round: an elector until it has led one term and stopped, or ctx ends.
// Reports whether leadership was lost (the elector stopped leading, not told to).
func (h *holder) follow(ctx context.Context, f *follower) bool {
	name := h.s.lease
	h.rec.record(event{"ev": "waiting", "lease": name})
	electCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	led := make(chan leadOutcome, 1)
	config := f.timing
	config.Lock, config.ReleaseOnCancel = f.lock, true
	config.Callbacks = leaderelection.LeaderCallbacks{
		OnStartedLeading: func(lead context.Context) { led <- h.leadFollowing(lead, cancel, f) },
		OnStoppedLeading: func() {},
	}
	leaderelection.RunOrDie(electCtx, config)

	out, ok := ledOutcome(electCtx, led)
	if !ok || !out.acquired {
		return false
	}
	if !out.letGo && ctx.Err() == nil {
		h.rec.record(event{
			"ev": "lost", "lease": name, "claim": out.claim,
			"reason": "client-go's elector stopped leading", "by_operator": false, "deadline_in": 0,
		})
		return true
	}
	h.released(ctx, out)
	return false
}

// leadFollowing is the work of one term, from OnStartedLeading: it waits for the operator to
// grant the term it leads (the status names its pod and the Lease's term as client-go left
// it), records the grant, and writes until its hold is over or leadership ends — asking
// nothing before a write. A newer grant to its pod meanwhile (the FencedLease or the Lease
// created again) is a new claim, and its token is written from then on. Then, if it still
// leads, it lets go by cancelling the elector's context. It returns once the leading context
// has ended: nothing is written after.
func (h *holder) leadFollowing(lead context.Context, release context.CancelFunc, f *follower) leadOutcome {
	defer func() { <-lead.Done() }()
	until := time.Now().Add(h.hold())
	get, cancel := context.WithTimeout(lead, writeTimeout)
	record, err := f.lock.Client.Leases(h.s.namespace).Get(get, f.lock.LeaseMeta.Name, metav1.GetOptions{})
	cancel()
	if err != nil || record.Spec.HolderIdentity == nil || *record.Spec.HolderIdentity != h.s.process {
		return leadOutcome{} // led, but the Lease names another already
	}
	var transitions int64
	if record.Spec.LeaseTransitions != nil {
		transitions = int64(*record.Spec.LeaseTransitions)
	}
	granted, ok := h.awaitGrant(lead, f.status, f.podUID, string(record.UID), transitions, until)
	if !ok {
		return leadOutcome{}
	}
	h.rec.record(event{"ev": "acquired", "lease": h.s.lease, "claim": granted.claim, "token": granted.token})
	out := leadOutcome{claim: granted.claim, token: granted.token, acquired: true}
	turn := h.rng.IntN(len(followRounds))
	for time.Now().Before(until) && lead.Err() == nil {
		if now, ok, _ := f.status.mine(f.podUID); ok && now.token > out.token {
			out.claim, out.token = now.claim, now.token
			h.rec.record(event{"ev": "acquired", "lease": h.s.lease, "claim": now.claim, "token": now.token})
		}
		turn = (turn + 1) % len(followRounds)
		h.res.write(h.rec, followRounds[turn], h.s.lease, out.token)
		sleep(lead, h.between(5, 60))
	}
	if lead.Err() != nil {
		return out
	}
	out.letGo = true
	out.zombie = h.rng.IntN(8) <= 1
	release()
	return out
}

// awaitGrant waits, until ctx ends or until, for the status to name pod uid as the holder of
// the followed Lease's term (leaseUID, transitions).
func (h *holder) awaitGrant(ctx context.Context, w *statusWatch, uid, leaseUID string, transitions int64, until time.Time) (term, bool) {
	deadline, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	for {
		t, ok, changed := w.mine(uid)
		if ok && t.leaseUID == leaseUID && t.transitions == transitions {
			return t, true
		}
		select {
		case <-deadline.Done():
			return term{}, false
		case <-changed:
		}
	}
}

// workloadPatch is the write n of the workload: its key and the patch, alternately the
// DaemonSet's metadata and its status.
func workloadPatch(lease, id string, n uint64) (key, subresource string, patch []byte) {
	name := "jepsen-" + lease
	if n%2 == 0 {
		return "daemonsets/" + name, "", fmt.Appendf(nil, `{"metadata":{"annotations":{"jepsen.fencing.dev/write":%q}}}`, id)
	}
	return "daemonsets/" + name + "/status", "status", fmt.Appendf(nil, `{"status":{"observedGeneration":%d}}`, n+1)
}

// patchWorkload sends write n of the workload (unstamped: only the writer's pod identity
// fences it).
func (r *resources) patchWorkload(ctx context.Context, lease, id string, n uint64) error {
	_, sub, patch := workloadPatch(lease, id, n)
	var subresources []string
	if sub != "" {
		subresources = append(subresources, sub)
	}
	_, err := r.kube.AppsV1().DaemonSets(r.namespace).Patch(ctx, "jepsen-"+lease, types.MergePatchType, patch, metav1.PatchOptions{}, subresources...)
	return err
}
