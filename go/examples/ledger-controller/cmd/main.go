// Command ledger-controller is a kubebuilder-layout controller that elects with a
// FencedLease through controller-runtime's own manager: one manager per process, caches
// warm and probes served on standbys, and every write of mgr.GetClient() stamped with the
// term's fencing token. Like every controller-runtime manager it leaves the process when it
// loses leadership (exit 1); its Deployment restarts it, and it campaigns again.
//
// Against kubebuilder's scaffolded cmd/main.go the change is the lines marked "fenced".
// It prints LEADING <token> when it leads and STOPPED when its manager stops.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/fenced-lease/fenced-lease/go/examples/ledger-controller/internal/controller"
	"github.com/fenced-lease/fenced-lease/go/lease"
	"github.com/fenced-lease/fenced-lease/go/lock"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

var (
	scheme   = runtime.NewScheme()
	setupLog = ctrl.Log.WithName("setup")
)

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
}

func main() {
	var namespace, leaseName, identity, metricsAddr, probeAddr string
	var work time.Duration
	flag.StringVar(&namespace, "namespace", "default", "namespace of the lease and the ledger")
	flag.StringVar(&leaseName, "lease", "ledger-controller", "the FencedLease to lead")
	flag.StringVar(&identity, "identity", lease.DefaultIdentity(), "this replica's identity")
	flag.StringVar(&metricsAddr, "metrics-bind-address", "0", "metrics address (0: off)")
	flag.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "probe address (0: off)")
	flag.DurationVar(&work, "work", time.Second, "how long one reconcile works before it writes")
	opts := zap.Options{}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))

	ctx := ctrl.SetupSignalHandler()
	cfg := ctrl.GetConfigOrDie()
	// fenced: the FencedLease as the manager's lock, with its timing and a stamping client.
	lk, err := lock.New(ctx, cfg, lock.Config{Namespace: namespace, Name: leaseName, Identity: identity})
	if err != nil {
		setupLog.Error(err, "unable to build the FencedLease lock")
		os.Exit(1)
	}
	mgrOpts, err := lk.ManagerOptions(ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: metricsAddr},
		HealthProbeBindAddress: probeAddr,
		Cache:                  cache.Options{DefaultNamespaces: map[string]cache.Config{namespace: {}}},
	})
	if err != nil {
		setupLog.Error(err, "unable to elect with the FencedLease")
		os.Exit(1)
	}
	mgr, err := ctrl.NewManager(cfg, mgrOpts)
	if err != nil {
		setupLog.Error(err, "unable to start manager")
		os.Exit(1)
	}

	if err := (&controller.LedgerReconciler{
		Client: mgr.GetClient(), Namespace: namespace, Identity: identity, Work: work,
	}).SetupWithManager(mgr); err != nil {
		setupLog.Error(err, "unable to create controller", "controller", "Ledger")
		os.Exit(1)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		setupLog.Error(err, "unable to set up health check")
		os.Exit(1)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		setupLog.Error(err, "unable to set up ready check")
		os.Exit(1)
	}
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		select {
		case <-mgr.Elected():
			token, _ := lk.Token()
			fmt.Println("LEADING", token)
		case <-ctx.Done():
		}
		return nil
	})); err != nil {
		setupLog.Error(err, "unable to add the leadership report")
		os.Exit(1)
	}

	setupLog.Info("starting manager")
	err = mgr.Start(ctx)
	fmt.Println("STOPPED")
	if err != nil {
		setupLog.Error(err, "problem running manager")
		os.Exit(1)
	}
}
