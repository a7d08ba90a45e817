package lock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fenced-lease/fenced-lease/go/api/v1alpha1"
	"github.com/fenced-lease/fenced-lease/go/fence"
	"github.com/fenced-lease/fenced-lease/go/lease"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Config of New.
type Config struct {
	// Namespace and Name of the FencedLease. Required; the lease must exist: the lock never
	// creates it.
	Namespace, Name string
	// Identity of this candidate. Default: lease.DefaultIdentity(), unique per process.
	Identity string
	// Pod is the candidate's pod, annotated with the token and owner of its claim. Default:
	// lease.PodFromEnv.
	Pod *lease.PodRef
	// Margin and RequestTimeout are those of lease.Options.
	Margin, RequestTimeout time.Duration
	// Timing is the elector's. Default: DefaultTiming of the lease's duration. New refuses a
	// timing that Timing.Check refuses.
	Timing Timing
	// EventRecorder, if set, records the elector's events ("became leader", "stopped
	// leading") on the FencedLease.
	EventRecorder resourcelock.EventRecorder
}

// Lock is a FencedLease as a resourcelock.Interface, and the term's token source. Build it
// with New. It is safe for concurrent use.
type Lock struct {
	client *lease.Client
	cfg    Config
	ctx    context.Context
	log    logr.Logger
	done   chan struct{}

	mu          sync.Mutex
	stopped     bool          // ctx is done: no goroutine starts any more
	term        *lease.Lease  // the term held, nil between terms
	last        *lease.Lease  // the last term granted, kept for Refusal
	campaigning bool          // a campaign goroutine runs (queued or holding)
	watching    bool          // the holder watch runs
	granted     time.Time     // when the term was granted
	lastUpdate  time.Time     // the elector's last accepted Update in this term
	ended       time.Time     // when the last term ended (zero: none yet)
	notBefore   time.Time     // no campaign before this, after a failed one
	lastErr     error         // why the last campaign failed
	holder      string        // the holder the lease names, as last seen
	changed     chan struct{} // closed (and replaced) when a campaign gets its term or fails
	wg          sync.WaitGroup
}

var _ resourcelock.Interface = (*Lock)(nil)

// New is a lock on the FencedLease cfg names, through the apiserver of config. It reads the
// lease's duration to default and check cfg.Timing. The lock campaigns from the elector's
// first call until ctx is done; then its claim is deleted (the next candidate is granted at
// once) and Done is closed. Give it the context the manager runs with. Logs go to ctx's
// logger, else controller-runtime's (ctrl.Log).
func New(ctx context.Context, config *rest.Config, cfg Config) (*Lock, error) {
	if cfg.Namespace == "" || cfg.Name == "" {
		return nil, errors.New("lock: Namespace and Name of the FencedLease are required")
	}
	c, err := lease.NewClient(config)
	if err != nil {
		return nil, err
	}
	if cfg.Identity == "" {
		cfg.Identity = lease.DefaultIdentity()
	}
	if cfg.Pod == nil {
		cfg.Pod = lease.PodFromEnv(cfg.Namespace)
	}
	read, cancel := context.WithTimeout(ctx, 10*time.Second)
	d, err := c.LeaseDuration(read, cfg.Namespace, cfg.Name)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("lock: %w", err)
	}
	if cfg.Timing == (Timing{}) {
		cfg.Timing = DefaultTiming(d, cfg.Margin)
	}
	if err := cfg.Timing.Check(d, cfg.Margin); err != nil {
		return nil, err
	}
	l := &Lock{
		client: c, cfg: cfg, ctx: ctx, done: make(chan struct{}), changed: make(chan struct{}),
		log: ctrllog.FromContext(ctx).WithName("fencedlease").WithValues("lease", cfg.Namespace+"/"+cfg.Name, "identity", cfg.Identity),
	}
	context.AfterFunc(ctx, func() {
		l.mu.Lock()
		l.stopped = true
		l.mu.Unlock()
		l.wg.Wait()
		close(l.done)
	})
	return l, nil
}

// Done is closed once the lock's context is done, its claim deleted and its goroutines
// stopped.
func (l *Lock) Done() <-chan struct{} { return l.done }

// Timing is the elector timing the lock was built for: give it to the elector.
func (l *Lock) Timing() Timing { return l.cfg.Timing }

// LeaderElectionConfig is client-go's elector configuration for this lock, with its timing,
// for programs that run a leaderelection.LeaderElector themselves.
func (l *Lock) LeaderElectionConfig(callbacks leaderelection.LeaderCallbacks) leaderelection.LeaderElectionConfig {
	return leaderelection.LeaderElectionConfig{
		Lock: l, Name: l.cfg.Name, ReleaseOnCancel: true, Callbacks: callbacks,
		LeaseDuration: l.cfg.Timing.LeaseDuration, RenewDeadline: l.cfg.Timing.RenewDeadline, RetryPeriod: l.cfg.Timing.RetryPeriod,
	}
}

// Token is the fencing token of the term while it is held (inside its local safe
// deadline); otherwise an error matching lease.ErrLost.
func (l *Lock) Token() (int64, error) {
	l.mu.Lock()
	term := l.term
	l.mu.Unlock()
	if term == nil {
		return 0, &lease.LostError{Lease: l.Describe(), Reason: lease.NotGranted}
	}
	return term.Token()
}

// Refusal says what err, an error of a write this lock's tokens fence, means, and reports a
// refusal for a stale token as lease.Lease.Refusal does (an error log line, the counter
// fenced_lease_holder_write_refusals_total, a Warning Event WriteRefused on the FencedLease,
// which the operator counts for the alert FencedLeaseWriteRefused), on the last term granted:
// a refusal mostly comes after that term has ended. lease.NotRefused for an error that is no
// refusal, and before the first term (nothing was written with a token of this lock).
func (l *Lock) Refusal(err error) lease.Refusal {
	l.mu.Lock()
	last := l.last
	l.mu.Unlock()
	if last == nil {
		return lease.NotRefused
	}
	return last.Refusal(err)
}

// Reported waits until the refusals reported so far (Refusal) are sent, at most two request
// timeouts or until ctx is done.
func (l *Lock) Reported(ctx context.Context) {
	l.mu.Lock()
	last := l.last
	l.mu.Unlock()
	if last != nil {
		last.Reported(ctx)
	}
}

// Claim is the name of the term's FencedLeaseClaim (the holder the FencedLease's status
// names while it is granted), empty between terms: for logs, and to match what the lease
// says. It is the claim of the term Token answers for until the lock has let go of the term,
// a little after Token starts to fail.
func (l *Lock) Claim() string {
	l.mu.Lock()
	term := l.term
	l.mu.Unlock()
	if term == nil {
		return ""
	}
	return term.Claim()
}

// TimeLeft is the time before the term's local safe deadline, zero between terms: work that
// would not finish inside it should not start.
func (l *Lock) TimeLeft() time.Duration {
	l.mu.Lock()
	term := l.term
	l.mu.Unlock()
	if term == nil {
		return 0
	}
	return term.TimeLeft()
}

// Get describes the lease as the lock sees it: this candidate is named holder only while its
// term is held; otherwise the holder is the one the FencedLease names.
//
// While this candidate's claim is queued, Get waits (until ctx is done, at most one
// LeaseDuration) for the grant, so that the elector leads as soon as the operator grants
// rather than at its next RetryPeriod; the elector's calls are the only thing it blocks.
func (l *Lock) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	l.mu.Lock()
	l.campaignLocked(time.Now())
	if l.campaigning && l.term == nil {
		wake := l.changed
		l.mu.Unlock()
		timer := time.NewTimer(l.cfg.Timing.LeaseDuration)
		select {
		case <-wake:
		case <-ctx.Done():
		case <-timer.C:
		}
		timer.Stop()
		l.mu.Lock()
	}
	term, holder, granted, failed := l.term, l.holder, l.granted, l.lastErr
	if l.campaigning {
		failed = nil
	}
	l.mu.Unlock()
	if holder == l.cfg.Identity {
		holder = "" // the lease names a term of ours that is over
	}
	rec := resourcelock.LeaderElectionRecord{HolderIdentity: holder, LeaseDurationSeconds: seconds(l.cfg.Timing.LeaseDuration)}
	if term != nil {
		if token, err := term.Token(); err == nil {
			at := metav1.NewTime(granted)
			rec = resourcelock.LeaderElectionRecord{
				HolderIdentity: l.cfg.Identity, LeaseDurationSeconds: seconds(term.Duration()),
				AcquireTime: at, RenewTime: at, LeaderTransitions: int(token),
			}
		}
	}
	if rec.HolderIdentity == "" && failed != nil {
		return nil, nil, failed
	}
	raw, err := json.Marshal(rec)
	return &rec, raw, err
}

// Create is refused: the FencedLease is created by its author, not by a candidate.
func (l *Lock) Create(context.Context, resourcelock.LeaderElectionRecord) error {
	return fmt.Errorf("lock: FencedLease %s cannot be read; the lock does not create it", l.Describe())
}

// Update is the elector's acquire or renew: accepted only while this candidate's term is
// held with more than RenewDeadline + 2 × RetryPeriod before its local safe deadline. A
// record with no holder is the elector stepping down: the claim is deleted.
func (l *Lock) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	now := time.Now()
	l.mu.Lock()
	l.campaignLocked(now)
	term := l.term
	if ler.HolderIdentity == "" {
		l.mu.Unlock()
		if term != nil {
			return term.Release(ctx)
		}
		return nil
	}
	defer l.mu.Unlock()
	if ler.HolderIdentity != l.cfg.Identity {
		return fmt.Errorf("lock: %s cannot make %q the holder of FencedLease %s", l.cfg.Identity, ler.HolderIdentity, l.Describe())
	}
	if term == nil {
		return fmt.Errorf("lock: FencedLease %s is not granted to %s", l.Describe(), l.cfg.Identity)
	}
	if left := term.TimeLeft(); !l.cfg.Timing.mayRenew(left) {
		return fmt.Errorf("lock: FencedLease %s: %v left before the local safe deadline, not more than RenewDeadline + 2 × RetryPeriod", l.Describe(), left)
	}
	l.lastUpdate = now
	return nil
}

// RecordEvent records an event of the elector on the FencedLease, if Config.EventRecorder is
// set.
func (l *Lock) RecordEvent(s string) {
	if l.cfg.EventRecorder == nil {
		return
	}
	ref := &v1alpha1.FencedLease{ObjectMeta: metav1.ObjectMeta{Namespace: l.cfg.Namespace, Name: l.cfg.Name}}
	ref.SetGroupVersionKind(v1alpha1.SchemeGroupVersion.WithKind("FencedLease"))
	l.cfg.EventRecorder.Eventf(ref, corev1.EventTypeNormal, "LeaderElection", "%s %s", l.cfg.Identity, s)
}

// Identity is this candidate's identity.
func (l *Lock) Identity() string { return l.cfg.Identity }

// Describe names the lease: namespace/name.
func (l *Lock) Describe() string { return l.cfg.Namespace + "/" + l.cfg.Name }

func seconds(d time.Duration) int { return int(max(d/time.Second, 1)) }

// campaignLocked starts a campaign (and the holder watch) if none runs, the last term's
// elector window is over, and no failure asks to wait. l.mu is held.
func (l *Lock) campaignLocked(now time.Time) {
	if l.stopped || l.ctx.Err() != nil {
		return
	}
	if !l.watching {
		l.watching = true
		l.wg.Add(1)
		go l.watchHolder()
	}
	if l.campaigning || now.Before(l.notBefore) || (!l.ended.IsZero() && now.Before(l.ended.Add(l.cfg.Timing.window()))) {
		return
	}
	l.campaigning = true
	l.wg.Add(1)
	go l.campaign()
}

// campaign queues a claim, waits for the grant, and keeps the term until it ends: one term.
func (l *Lock) campaign() {
	defer l.wg.Done()
	term, err := lease.Acquire(logr.NewContext(l.ctx, l.log), l.client, l.cfg.Namespace, l.cfg.Name, lease.Options{
		Identity: l.cfg.Identity, Pod: l.cfg.Pod, Wait: lease.WaitForever,
		Margin: l.cfg.Margin, RequestTimeout: l.cfg.RequestTimeout,
	})
	if err != nil {
		l.mu.Lock()
		l.campaigning, l.lastErr = false, err
		l.notBefore = time.Now().Add(l.cfg.Timing.RetryPeriod * 5)
		l.wakeLocked()
		l.mu.Unlock()
		if l.ctx.Err() == nil {
			l.log.Error(err, "campaign failed; the elector's next call tries again")
		}
		return
	}
	token, _ := term.Token()
	l.mu.Lock()
	l.term, l.last, l.granted, l.lastUpdate, l.lastErr = term, term, time.Now(), time.Time{}, nil
	l.wakeLocked()
	l.mu.Unlock()
	l.log.Info("term granted", "token", token, "claim", term.Claim())

	why := l.keep(term)
	release, cancel := context.WithTimeout(context.WithoutCancel(l.ctx), 10*time.Second)
	if err := term.Release(release); err != nil {
		l.log.Info("could not delete claim; it expires instead", "error", err.Error())
	}
	cancel()
	l.mu.Lock()
	l.term, l.campaigning, l.ended = nil, false, time.Now()
	l.mu.Unlock()
	l.log.Info("term over", "token", token, "why", why)
}

// wakeLocked wakes the elector's calls waiting in Get. l.mu is held.
func (l *Lock) wakeLocked() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// keep waits until the term ends, or until the elector has not renewed it for the elector
// window (it stopped leading, or never started); says which.
func (l *Lock) keep(term *lease.Lease) string {
	for {
		l.mu.Lock()
		last := l.lastUpdate
		if last.IsZero() {
			last = l.granted
		}
		l.mu.Unlock()
		idle := time.Until(last.Add(l.cfg.Timing.window()))
		if idle <= 0 {
			return "the elector stopped renewing"
		}
		timer := time.NewTimer(idle)
		select {
		case <-term.Done():
			timer.Stop()
			return fmt.Sprint(term.Err())
		case <-timer.C:
		}
	}
}

// watchHolder keeps the holder the lease names, for Get.
func (l *Lock) watchHolder() {
	defer l.wg.Done()
	l.client.WatchHolder(l.ctx, l.cfg.Namespace, l.cfg.Name, func(identity string) {
		l.mu.Lock()
		l.holder = identity
		l.mu.Unlock()
	})
}

// ManagerOptions is o set to elect with this lock: LeaderElection on, this lock as
// LeaderElectionResourceLockInterface, the lock's Timing, release on cancel, a client
// (mgr.GetClient()) that stamps every write with the term's token and refuses to write while
// this replica does not lead, the lock in the base context of every runnable (TokensFrom),
// and the lock's metrics in controller-runtime's registry. It refuses an o whose timing or
// lock says otherwise.
func (l *Lock) ManagerOptions(o manager.Options) (manager.Options, error) {
	if o.LeaderElectionResourceLockInterface != nil && o.LeaderElectionResourceLockInterface != l {
		return o, fmt.Errorf("lock: Options.LeaderElectionResourceLockInterface is another lock")
	}
	t := l.cfg.Timing
	for _, f := range []struct {
		name string
		set  *time.Duration
		want time.Duration
	}{{"LeaseDuration", o.LeaseDuration, t.LeaseDuration}, {"RenewDeadline", o.RenewDeadline, t.RenewDeadline}, {"RetryPeriod", o.RetryPeriod, t.RetryPeriod}} {
		if f.set != nil && *f.set != f.want {
			return o, fmt.Errorf("lock: Options.%s is %v, the lock's %v: set lock.Config.Timing instead", f.name, *f.set, f.want)
		}
	}
	o.LeaderElection = true
	o.LeaderElectionResourceLockInterface = l
	if o.LeaderElectionID == "" {
		o.LeaderElectionID = l.cfg.Name
	}
	o.LeaderElectionReleaseOnCancel = true
	o.LeaseDuration, o.RenewDeadline, o.RetryPeriod = &t.LeaseDuration, &t.RenewDeadline, &t.RetryPeriod
	newClient := o.NewClient
	if newClient == nil {
		newClient = client.New
	}
	o.NewClient = func(config *rest.Config, options client.Options) (client.Client, error) {
		inner, err := newClient(config, options)
		if err != nil {
			return nil, err
		}
		return fence.NewClient(inner, l.cfg.Name, l), nil
	}
	base := o.BaseContext
	o.BaseContext = func() context.Context {
		ctx := context.Background()
		if base != nil {
			ctx = base()
		}
		return WithTokens(ctx, l)
	}
	l.register(metrics.Registry)
	return o, nil
}

// register adds the lock's gauges to reg: fencedlease_leader (1 while the term is held) and
// fencedlease_token (the term's token, 0 between terms), labelled with the lease and this
// candidate's identity. Registering a lock twice keeps the first registration.
func (l *Lock) register(reg prometheus.Registerer) {
	labels := prometheus.Labels{"lease": l.Describe(), "identity": l.cfg.Identity}
	leader := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "fencedlease_leader", Help: "1 while this replica holds the FencedLease (inside its local safe deadline), else 0.", ConstLabels: labels,
	}, func() float64 {
		if _, err := l.Token(); err != nil {
			return 0
		}
		return 1
	})
	token := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "fencedlease_token", Help: "The fencing token of this replica's current term, 0 between terms.", ConstLabels: labels,
	}, func() float64 {
		t, _ := l.Token()
		return float64(t)
	})
	for _, c := range []prometheus.Collector{leader, token} {
		_ = reg.Register(c) // AlreadyRegistered: this lock was registered before
	}
}
