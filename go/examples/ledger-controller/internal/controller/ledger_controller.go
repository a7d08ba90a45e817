// Package controller holds the ledger controller's reconciler.
package controller

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/fenced-lease/fenced-lease/go/fence"
	"github.com/fenced-lease/fenced-lease/go/lease"
	"github.com/fenced-lease/fenced-lease/go/lock"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
)

// LedgerName is the ConfigMap the controller keeps.
const LedgerName = "ledger"

// LedgerReconciler counts its writes in the ConfigMap ledger. It prints what it does:
//
//	WORKING <token>
//	WRITE accepted <token> | WRITE refused-by-apiserver <error> | WRITE refused-locally <error>
type LedgerReconciler struct {
	// Client is the manager's: it stamps every write with the term's token.
	client.Client
	Namespace, Identity string
	// Work is how long one reconcile works before it writes.
	Work time.Duration
}

// SetupWithManager watches the ledger, and queues it once at start so that a missing ledger
// is created.
func (r *LedgerReconciler) SetupWithManager(mgr ctrl.Manager) error {
	isLedger := predicate.NewPredicateFuncs(func(o client.Object) bool { return o.GetName() == LedgerName })
	kickoff := source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Namespace: r.Namespace, Name: LedgerName}})
		return nil
	})
	return ctrl.NewControllerManagedBy(mgr).Named("ledger").
		For(&corev1.ConfigMap{}, builder.WithPredicates(isLedger)).
		WatchesRawSource(kickoff).
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
	// The term's token, for guards outside Kubernetes (fence/postgres, fence/redis).
	token, err := lock.TokensFrom(ctx).Token()
	if err != nil {
		return ctrl.Result{}, err
	}
	fmt.Println("WORKING", token)
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
