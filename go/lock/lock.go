package lock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fenced-lease/fenced-lease/go/api/v1alpha1"
	"github.com/fenced-lease/fenced-lease/go/lease"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
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
	stopped     bool         // ctx is done: no goroutine starts any more
	term        *lease.Lease // the term held, nil between terms
	campaigning bool         // a campaign goroutine runs (queued or holding)
	watching    bool         // the holder watch runs
	granted     time.Time    // when the term was granted
	lastUpdate  time.Time    // the elector's last accepted Update in this term
	ended       time.Time    // when the last term ended (zero: none yet)
	notBefore   time.Time    // no campaign before this, after a failed one
	lastErr     error        // why the last campaign failed
	holder      string       // the holder the lease names, as last seen
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
		client: c, cfg: cfg, ctx: ctx, done: make(chan struct{}),
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

// Get describes the lease as the lock sees it: this candidate is named holder only while its
// term is held; otherwise the holder is the one the FencedLease names.
func (l *Lock) Get(context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	l.mu.Lock()
	l.campaignLocked(time.Now())
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

// Update is the elector's acquire or renew: accepted only while this candidate's term is held
// with more than RenewDeadline + RetryPeriod before its local safe deadline. A record with no
// holder is the elector stepping down: the claim is deleted.
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
		return fmt.Errorf("lock: FencedLease %s: %v left before the local safe deadline, not more than RenewDeadline + RetryPeriod", l.Describe(), left)
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
