package lock

import (
	"context"
	"fmt"
	"time"

	"github.com/fenced-lease/fenced-lease/go/fence"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

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

type tokensKey struct{}

// WithTokens is ctx carrying tokens, for TokensFrom.
func WithTokens(ctx context.Context, tokens fence.TokenSource) context.Context {
	return context.WithValue(ctx, tokensKey{}, tokens)
}

// TokensFrom is the token source ctx carries: in a reconciler of a manager built with
// ManagerOptions, the Lock. Without one, its Token always fails.
func TokensFrom(ctx context.Context) fence.TokenSource {
	if t, ok := ctx.Value(tokensKey{}).(fence.TokenSource); ok {
		return t
	}
	return noTokens{}
}

type noTokens struct{}

func (noTokens) Token() (int64, error) {
	return 0, fmt.Errorf("lock: no token source in this context (build the manager with Lock.ManagerOptions)")
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
