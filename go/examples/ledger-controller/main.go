// Command ledger-controller is a kubebuilder-style controller run by fenced leader
// election: its manager runs only while it holds the FencedLease, and every write of its
// client is stamped with the term's token. It keeps a ConfigMap "ledger" whose count it
// increments after a second of "work" per reconcile, and prints each write's outcome:
//
//	LEADING <token> | STOPPED
//	WORKING
//	WRITE accepted <token> | WRITE refused-by-apiserver <error> | WRITE refused-locally <error>
//
// Against kubebuilder's main.go the change is: ctrl.NewManager + mgr.Start become
// manager.Run, and the controllers are set up in the function it calls each term.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/fenced-lease/fenced-lease/go/fence"
	"github.com/fenced-lease/fenced-lease/go/lease"
	"github.com/fenced-lease/fenced-lease/go/manager"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
)

// LedgerName is the ConfigMap the controller keeps.
const LedgerName = "ledger"

func main() {
	var namespace, leaseName, identity, metricsAddr, probeAddr string
	var work time.Duration
	flag.StringVar(&namespace, "namespace", "default", "namespace of the lease and the ledger")
	flag.StringVar(&leaseName, "lease", "ledger-controller", "the FencedLease to lead")
	flag.StringVar(&identity, "identity", lease.DefaultIdentity(), "this replica's identity")
	flag.StringVar(&metricsAddr, "metrics-bind-address", "0", "metrics address (0: off)")
	flag.StringVar(&probeAddr, "health-probe-bind-address", "0", "probe address (0: off)")
	flag.DurationVar(&work, "work", time.Second, "how long one reconcile works before it writes")
	flag.Parse()
	ctrl.SetLogger(zap.New())

	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)

	err := manager.Run(ctrl.SetupSignalHandler(), ctrl.GetConfigOrDie(), manager.Options{
		Namespace: namespace, Lease: leaseName, Identity: identity,
		Manager: ctrl.Options{
			Scheme:                 scheme,
			Metrics:                metricsserver.Options{BindAddress: metricsAddr},
			HealthProbeBindAddress: probeAddr,
			Cache:                  cache.Options{DefaultNamespaces: map[string]cache.Config{namespace: {}}},
		},
		OnTerm: func(token int64, leading bool) {
			if leading {
				fmt.Println("LEADING", token)
			} else {
				fmt.Println("STOPPED")
			}
		},
	}, func(mgr ctrl.Manager) error {
		return (&LedgerReconciler{Client: mgr.GetClient(), Namespace: namespace, Identity: identity, Work: work}).SetupWithManager(mgr)
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// LedgerReconciler counts its writes in the ConfigMap ledger.
type LedgerReconciler struct {
	client.Client
	Namespace, Identity string
	Work                time.Duration
}

// SetupWithManager watches the ledger.
func (r *LedgerReconciler) SetupWithManager(mgr ctrl.Manager) error {
	isLedger := predicate.NewPredicateFuncs(func(o client.Object) bool { return o.GetName() == LedgerName })
	return ctrl.NewControllerManagedBy(mgr).Named("ledger").
		For(&corev1.ConfigMap{}, builder.WithPredicates(isLedger)).
		WatchesRawSource(kickoff(r.Namespace)).
		Complete(r)
}

// Reconcile reads the ledger, works, and writes the count plus one (creating the ledger if
// it is missing). It does not look at its context while it works, as a slow or stalled
// reconcile would not: the client's fencing is what stops a stale write.
func (r *LedgerReconciler) Reconcile(ctx context.Context, _ ctrl.Request) (ctrl.Result, error) {
	ledger := &corev1.ConfigMap{}
	err := r.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: LedgerName}, ledger)
	missing := apierrors.IsNotFound(err)
	if err != nil && !missing {
		return ctrl.Result{}, err
	}
	fmt.Println("WORKING")
	time.Sleep(r.Work)
	if missing {
		ledger = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: r.Namespace, Name: LedgerName}}
	}
	count, _ := strconv.Atoi(ledger.Data["count"])
	ledger.Data = map[string]string{"count": strconv.Itoa(count + 1), "writer": r.Identity}
	write := context.WithoutCancel(ctx) // a write already under way is sent
	if missing {
		err = r.Create(write, ledger)
	} else {
		err = r.Update(write, ledger)
	}
	report(ledger, err)
	return ctrl.Result{RequeueAfter: 50 * time.Millisecond}, nil
}

func report(ledger *corev1.ConfigMap, err error) {
	switch {
	case err == nil:
		token, _ := fence.TokenOf(ledger)
		fmt.Println("WRITE accepted", token)
	case errors.Is(err, fence.ErrFenced):
		fmt.Println("WRITE refused-by-apiserver", err)
	case errors.Is(err, lease.ErrLost):
		fmt.Println("WRITE refused-locally", err)
	default:
		fmt.Println("WRITE failed", err)
	}
}
