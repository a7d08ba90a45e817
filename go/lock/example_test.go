package lock_test

import (
	"github.com/fenced-lease/fenced-lease/go/lock"
	"k8s.io/apimachinery/pkg/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
)

// A kubebuilder cmd/main.go electing with a FencedLease (compiled, not run: it needs a
// cluster). go/README.md shows these lines.
func Example() {
	scheme := runtime.NewScheme()
	ctx, cfg := ctrl.SetupSignalHandler(), ctrl.GetConfigOrDie()
	lk, err := lock.New(ctx, cfg, lock.Config{Namespace: "payouts", Name: "payout-controller"})
	if err != nil {
		panic(err)
	}
	opts, err := lk.ManagerOptions(ctrl.Options{Scheme: scheme}) // its timing; a stamping client
	if err != nil {
		panic(err)
	}
	mgr, err := ctrl.NewManager(cfg, opts) // leaves the process on loss
	if err != nil {
		panic(err)
	}
	// Set up reconcilers with mgr.GetClient() (it stamps every write) and lk (the token).
	if err := mgr.Start(ctx); err != nil {
		panic(err) // leadership lost: exit, to be restarted
	}
}
