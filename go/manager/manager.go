// Package manager runs a controller-runtime manager only while it leads a FencedLease, with
// a client that stamps every write with the term's fencing token. From a kubebuilder-style
// main.go the change is a few lines: the manager is built per term, so the controllers are
// set up in a function:
//
//	err := manager.Run(ctrl.SetupSignalHandler(), ctrl.GetConfigOrDie(), manager.Options{
//		Namespace: "payouts", Lease: "payout-controller", Manager: ctrl.Options{Scheme: scheme},
//	}, func(mgr ctrl.Manager) error {
//		return (&PayoutReconciler{Client: mgr.GetClient()}).SetupWithManager(mgr)
//	})
//
// It replaces the manager's own leader election (LeaderElection: true), which does not
// fence: here a replica paused past its lease stops at its local safe deadline, and a write
// it had in flight carries a token the apiserver refuses.
package manager

import (
	"context"
	"fmt"
	"time"

	"github.com/fenced-lease/fenced-lease/go/election"
	"github.com/fenced-lease/fenced-lease/go/fence"
	"github.com/fenced-lease/fenced-lease/go/lease"
	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmanager "sigs.k8s.io/controller-runtime/pkg/manager"
)

// Options of Run.
type Options struct {
	// Namespace and Lease name the FencedLease to lead. Required.
	Namespace, Lease string
	// Identity of this replica. Default: lease.DefaultIdentity().
	Identity string
	// Margin and RequestTimeout are those of lease.Options.
	Margin, RequestTimeout time.Duration
	// Manager is the manager's options, as for ctrl.NewManager. Its LeaderElection must be
	// off; NewClient, if set, is wrapped.
	Manager ctrlmanager.Options
	// OnTerm, if set, is told of each term's start (with its token) and end.
	OnTerm func(token int64, leading bool)
}

// Run campaigns for the lease until ctx is done. During each term it builds a manager with
// opts.Manager, whose client (mgr.GetClient()) stamps every write with the term's token and
// refuses to write once the term is over, calls setup to add the controllers, and runs the
// manager until the term ends. It campaigns again after every loss, and after a term whose
// setup or manager failed. Logs go to the logr.Logger in ctx, if any.
func Run(ctx context.Context, cfg *rest.Config, opts Options, setup func(ctrlmanager.Manager) error) error {
	if opts.Manager.LeaderElection {
		return fmt.Errorf("manager: turn the manager's own LeaderElection off: the FencedLease elects")
	}
	log := logr.FromContextOrDiscard(ctx)
	c, err := lease.NewClient(cfg)
	if err != nil {
		return err
	}
	var le *election.LeaderElector
	le, err = election.NewLeaderElector(election.LeaderElectionConfig{
		Client: c, Namespace: opts.Namespace, Name: opts.Lease, Identity: opts.Identity,
		Pod: lease.PodFromEnv(opts.Namespace), Margin: opts.Margin, RequestTimeout: opts.RequestTimeout,
		Callbacks: election.LeaderCallbacks{
			OnStartedLeading: func(term context.Context, token int64) {
				if opts.OnTerm != nil {
					opts.OnTerm(token, true)
				}
				if err := runTerm(term, cfg, opts, le, setup); err != nil {
					log.Error(err, "term ended with an error; stepping down")
				}
			},
			OnStoppedLeading: func() {
				if opts.OnTerm != nil {
					opts.OnTerm(0, false)
				}
			},
		},
	})
	if err != nil {
		return err
	}
	return le.Run(ctx)
}

// runTerm builds a manager whose client stamps with tokens, sets it up and runs it until
// term is done.
func runTerm(term context.Context, cfg *rest.Config, opts Options, tokens fence.TokenSource, setup func(ctrlmanager.Manager) error) error {
	mo := opts.Manager
	newClient := mo.NewClient
	if newClient == nil {
		newClient = client.New
	}
	mo.NewClient = func(config *rest.Config, options client.Options) (client.Client, error) {
		inner, err := newClient(config, options)
		if err != nil {
			return nil, err
		}
		return fence.NewClient(inner, opts.Lease, tokens), nil
	}
	mgr, err := ctrlmanager.New(cfg, mo)
	if err != nil {
		return fmt.Errorf("manager: %w", err)
	}
	if err := setup(mgr); err != nil {
		return fmt.Errorf("manager setup: %w", err)
	}
	return mgr.Start(term)
}
