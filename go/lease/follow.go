package lease

import (
	"context"
	"time"

	"github.com/fenced-lease/fenced-lease/go/api/v1alpha1"
	"github.com/fenced-lease/fenced-lease/go/internal/backoff"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
)

// watchBackoff is how watches come back after the API went away: quickly (a holder's
// deadline is short), 200 ms doubling to 3 s, jittered so that holders do not reconnect in
// step.
var watchBackoff = backoff.Backoff{Base: 200 * time.Millisecond, Cap: 3 * time.Second}

// followObject feeds seen with object name of resource in ns until seen returns false or ctx
// is done: a fresh read by get (the first time, seed if not nil), nil when the object is not
// found, then each object a watch from that read's resourceVersion ("" after not found)
// delivers, nil once it is deleted. When the watch ends it reads and watches again at once;
// after an error (of the read, the watch's start or an error event) it calls failed (if not
// nil) with the error and the count of failures since a watch last started, and reads again
// after watchBackoff. get bounds its call with a timeout of its own.
func (c *Client) followObject(ctx context.Context, ns, resource, name string, seed runtime.Object,
	get func(context.Context) (runtime.Object, error), seen func(obj runtime.Object) (keep bool),
	failed func(err error, failures int)) {
	failures := 0
	for ctx.Err() == nil {
		stop, err := c.followOnce(ctx, ns, resource, name, seed, get, seen, &failures)
		seed = nil
		switch {
		case stop || ctx.Err() != nil:
			return
		case err == nil:
			continue // the watch ended normally: read and watch again
		}
		failures++
		if failed != nil {
			failed(err, failures)
		}
		if !backoff.Sleep(ctx, watchBackoff.Pause(failures, randFloat())) {
			return
		}
	}
}

// followOnce is one read and one watch of followObject; stop once seen said so.
func (c *Client) followOnce(ctx context.Context, ns, resource, name string, seed runtime.Object,
	get func(context.Context) (runtime.Object, error), seen func(runtime.Object) bool, failures *int) (stop bool, err error) {
	obj := seed
	if obj == nil {
		obj, err = get(ctx)
	}
	rv := ""
	switch {
	case apierrors.IsNotFound(err):
		if !seen(nil) {
			return true, nil
		}
	case err != nil:
		return false, err
	default:
		if !seen(obj) {
			return true, nil
		}
		rv = obj.(metav1.Object).GetResourceVersion()
	}
	if ctx.Err() != nil {
		return true, nil
	}
	w, err := c.watchOne(ctx, ns, resource, name, rv)
	if err != nil {
		return false, err
	}
	defer w.Stop()
	*failures = 0
	for ev := range w.ResultChan() {
		keep := true
		switch ev.Type {
		case watch.Added, watch.Modified:
			keep = seen(ev.Object)
		case watch.Deleted:
			keep = seen(nil)
		case watch.Error:
			return false, apierrors.FromObject(ev.Object)
		}
		if !keep || ctx.Err() != nil {
			return true, nil
		}
	}
	return false, nil
}

// follow follows object name of resource for the keeper until the hold ends: a missing
// object ends it (seen must end the hold for nil), the first failure in a row is logged.
func (k *keeper) follow(resource, name string, seed runtime.Object, get func(context.Context) (runtime.Object, error), seen func(runtime.Object)) {
	timed := func(ctx context.Context) (runtime.Object, error) {
		ctx, cancel := context.WithTimeout(ctx, k.timing().callTimeout)
		defer cancel()
		return get(ctx)
	}
	keep := func(obj runtime.Object) bool {
		seen(obj)
		return obj != nil
	}
	failed := func(err error, failures int) {
		if failures == 1 {
			k.log.Info("watch failed; retrying", "resource", resource, "error", err.Error())
		}
	}
	k.client.followObject(k.ctx, k.namespace, resource, name, seed, timed, keep, failed)
}

// followClaim follows the claim: the grant, the queue position, expiry and revocation,
// deletion.
func (k *keeper) followClaim() {
	defer k.wg.Done()
	get := func(ctx context.Context) (runtime.Object, error) {
		return k.client.getClaim(ctx, k.namespace, k.claim)
	}
	k.follow(v1alpha1.ClaimsResource, k.claim, k.seedClaim, get, func(obj runtime.Object) {
		c, _ := obj.(*v1alpha1.FencedLeaseClaim)
		if c == nil {
			k.end(ClaimDeleted, "")
			return
		}
		view := viewClaim(c)
		k.update(func(t *tracker) bool { return t.observeClaim(view, bootNow()) })
	})
}

// followLease follows the lease, the source of truth: the grant shows there first, and so
// does a newer holder.
func (k *keeper) followLease() {
	defer k.wg.Done()
	get := func(ctx context.Context) (runtime.Object, error) {
		return k.client.getLease(ctx, k.namespace, k.lease)
	}
	k.follow(v1alpha1.LeasesResource, k.lease, k.seedLease, get, func(obj runtime.Object) {
		l, _ := obj.(*v1alpha1.FencedLease)
		var view *leaseView
		if l != nil {
			v := viewLease(l)
			view = &v
		}
		k.update(func(t *tracker) bool { return t.observeLease(view, bootNow()) })
	})
}
