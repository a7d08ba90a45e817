// Package election is fenced leader election, shaped like client-go's
// tools/leaderelection: a candidate leads while it holds a FencedLease, OnStartedLeading gets
// the term's fencing token to stamp on every write and a context that is cancelled at the
// local safe deadline or on loss, and the candidate campaigns again after every loss.
//
//	le, err := election.NewLeaderElector(election.LeaderElectionConfig{
//		Client: c, Namespace: "default", Name: "my-controller",
//		Callbacks: election.LeaderCallbacks{
//			OnStartedLeading: func(ctx context.Context, token int64) { run(ctx, token) },
//			OnStoppedLeading: func() { log.Print("stopped leading") },
//		},
//	})
//	...
//	err = le.Run(ctx) // returns when ctx is done, the lease released
package election

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/fenced-lease/fenced-lease/go/internal/backoff"
	"github.com/fenced-lease/fenced-lease/go/lease"
	"github.com/go-logr/logr"
)

// LeaderCallbacks are called as leadership changes, as in client-go.
type LeaderCallbacks struct {
	// OnStartedLeading runs each term, in a goroutine of its own, with a context cancelled
	// when the term ends (lost, at the local safe deadline at the latest, or released) and
	// the term's fencing token. The term also ends when it returns (a step-down). Required.
	OnStartedLeading func(ctx context.Context, token int64)
	// OnStoppedLeading is called after each term, once OnStartedLeading has returned.
	// Required.
	OnStoppedLeading func()
	// OnNewLeader is called with the identity of the holder the lease names ("" for none)
	// each time it changes, from one goroutine, in order. Optional.
	OnNewLeader func(identity string)
}

// LeaderElectionConfig configures a LeaderElector.
type LeaderElectionConfig struct {
	// Client talks to the fencing.dev API. Required.
	Client *lease.Client
	// Namespace and Name of the FencedLease. Required; the lease must exist.
	Namespace, Name string
	// Identity of this candidate. Default: lease.DefaultIdentity(), unique per process.
	Identity string
	// Pod, Margin and RequestTimeout are those of lease.Options.
	Pod            *lease.PodRef
	Margin         time.Duration
	RequestTimeout time.Duration
	// Callbacks to call.
	Callbacks LeaderCallbacks
}

// LeaderElector campaigns for a FencedLease. Build it with NewLeaderElector.
type LeaderElector struct {
	cfg     LeaderElectionConfig
	mu      sync.Mutex
	leader  string
	current *lease.Lease
}

// NewLeaderElector checks cfg and returns an elector.
func NewLeaderElector(cfg LeaderElectionConfig) (*LeaderElector, error) {
	switch {
	case cfg.Client == nil:
		return nil, errors.New("election: Client is required")
	case cfg.Namespace == "" || cfg.Name == "":
		return nil, errors.New("election: Namespace and Name of the FencedLease are required")
	case cfg.Callbacks.OnStartedLeading == nil || cfg.Callbacks.OnStoppedLeading == nil:
		return nil, errors.New("election: OnStartedLeading and OnStoppedLeading are required")
	}
	if cfg.Identity == "" {
		cfg.Identity = lease.DefaultIdentity()
	}
	return &LeaderElector{cfg: cfg}, nil
}

// RunOrDie builds an elector and runs it until ctx is done; it panics on a configuration
// error or on a campaign that cannot succeed without a person.
func RunOrDie(ctx context.Context, cfg LeaderElectionConfig) {
	le, err := NewLeaderElector(cfg)
	if err != nil {
		panic(err)
	}
	if err := le.Run(ctx); err != nil {
		panic(err)
	}
}

// Identity is this candidate's identity.
func (le *LeaderElector) Identity() string { return le.cfg.Identity }

// IsLeader reports whether this candidate leads now (inside its local safe deadline).
func (le *LeaderElector) IsLeader() bool {
	_, err := le.Token()
	return err == nil
}

// Token is the fencing token of the current term while this candidate leads; otherwise an
// error matching lease.ErrLost.
func (le *LeaderElector) Token() (int64, error) {
	le.mu.Lock()
	l := le.current
	le.mu.Unlock()
	if l == nil {
		return 0, &lease.LostError{Lease: le.cfg.Namespace + "/" + le.cfg.Name, Reason: lease.NotGranted}
	}
	return l.Token()
}

// GetLeader is the identity of the holder the lease names, as last seen ("" for none).
func (le *LeaderElector) GetLeader() string {
	le.mu.Lock()
	defer le.mu.Unlock()
	return le.leader
}

// Run campaigns until ctx is done, then returns nil, having released the lease if it led.
// It returns an error only when campaigning cannot succeed without a person: the lease does
// not exist, RBAC forbids, or the margin is invalid. Failures that may pass are retried with
// jittered backoff. Logs go to the logr.Logger in ctx, else to controller-runtime's (ctrl.Log).
func (le *LeaderElector) Run(ctx context.Context) error {
	log := lease.Logger(ctx).WithValues("lease", le.cfg.Namespace+"/"+le.cfg.Name)
	var follower sync.WaitGroup
	followCtx, stopFollowing := context.WithCancel(ctx)
	defer func() {
		stopFollowing()
		follower.Wait()
	}()
	follower.Add(1)
	go func() {
		defer follower.Done()
		le.cfg.Client.WatchHolder(followCtx, le.cfg.Namespace, le.cfg.Name, le.newLeader)
	}()
	failures := 0
	for ctx.Err() == nil {
		l, err := lease.Acquire(ctx, le.cfg.Client, le.cfg.Namespace, le.cfg.Name, lease.Options{
			Identity: le.cfg.Identity, Pod: le.cfg.Pod, Wait: lease.WaitForever,
			Margin: le.cfg.Margin, RequestTimeout: le.cfg.RequestTimeout,
		})
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, lease.ErrLeaseNotFound), errors.Is(err, lease.ErrForbidden), errors.Is(err, lease.ErrInvalidMargin):
			return fmt.Errorf("election: %w", err)
		case err != nil:
			failures++
			log.Info("candidacy failed; retrying", "error", err.Error())
			if !backoff.Sleep(ctx, retryBackoff.Pause(failures, rand.Float64())) {
				return nil
			}
			continue
		}
		failures = 0
		if steppedDown := le.lead(ctx, log, l); steppedDown && !backoff.Sleep(ctx, retryBackoff.Pause(1, rand.Float64())) {
			return nil
		}
	}
	return nil
}

// lead runs one term; reports whether it ended by a step-down (OnStartedLeading returned
// while the lease was still held).
func (le *LeaderElector) lead(ctx context.Context, log logr.Logger, l *lease.Lease) bool {
	token, err := l.Token()
	le.mu.Lock()
	le.current = l
	le.mu.Unlock()
	log.Info("started leading", "token", token, "claim", l.Claim())
	returned := make(chan struct{})
	if err == nil {
		go func() {
			defer close(returned)
			le.cfg.Callbacks.OnStartedLeading(l.Context(), token)
		}()
	} else {
		close(returned)
	}
	steppedDown := false
	select {
	case <-l.Done():
	case <-ctx.Done():
	case <-returned:
		steppedDown = l.Held()
	}
	release, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	if err := l.Release(release); err != nil {
		log.Info("could not delete claim; it expires instead", "error", err.Error())
	}
	cancel()
	<-returned
	le.mu.Lock()
	le.current = nil
	le.mu.Unlock()
	log.Info("stopped leading", "reason", context.Cause(l.Context()).Error(), "steppedDown", steppedDown)
	le.cfg.Callbacks.OnStoppedLeading()
	return steppedDown
}

func (le *LeaderElector) newLeader(identity string) {
	le.mu.Lock()
	le.leader = identity
	le.mu.Unlock()
	if le.cfg.Callbacks.OnNewLeader != nil {
		le.cfg.Callbacks.OnNewLeader(identity)
	}
}

// retryBackoff paces candidacy retries: 1 s doubling to 30 s, jittered.
var retryBackoff = backoff.Backoff{Base: time.Second, Cap: 30 * time.Second}
