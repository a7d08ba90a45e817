package lease

import (
	"context"
	"errors"
	"time"

	"github.com/fenced-lease/fenced-lease/go/api/v1alpha1"
	"github.com/fenced-lease/fenced-lease/go/internal/backoff"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
)

// errStop ends a follow loop: the hold is over.
var errStop = errors.New("stop following")

// watchBackoff is how watches come back after the API went away: quickly (a holder's
// deadline is short), 200 ms doubling to 3 s, jittered so that holders do not reconnect in
// step.
var watchBackoff = backoff.Backoff{Base: 200 * time.Millisecond, Cap: 3 * time.Second}

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

// follow feeds seen with object name of resource (nil once deleted): a fresh read (the first
// time, seed if not nil), then a watch from that read's resourceVersion, again after every
// error, until the hold ends.
func (k *keeper) follow(resource, name string, seed runtime.Object, get func(context.Context) (runtime.Object, error), seen func(runtime.Object)) {
	failures := 0
	for k.ctx.Err() == nil {
		err := k.followOnce(resource, name, seed, get, seen, &failures)
		seed = nil
		if errors.Is(err, errStop) || k.ctx.Err() != nil {
			return
		}
		if err == nil {
			continue // the watch ended normally: read and watch again
		}
		failures++
		if failures == 1 {
			k.log.Info("watch failed; retrying", "resource", resource, "error", err.Error())
		}
		if !backoff.Sleep(k.ctx, watchBackoff.Pause(failures, randFloat())) {
			return
		}
	}
}

func (k *keeper) followOnce(resource, name string, seed runtime.Object, get func(context.Context) (runtime.Object, error), seen func(runtime.Object), failures *int) error {
	obj, err := seed, error(nil)
	if obj == nil {
		ctx, cancel := context.WithTimeout(k.ctx, k.timing().callTimeout)
		obj, err = get(ctx)
		cancel()
	}
	if apierrors.IsNotFound(err) {
		seen(nil)
		return errStop
	}
	if err != nil {
		return err
	}
	seen(obj)
	if k.ctx.Err() != nil {
		return errStop
	}
	rv := obj.(metav1.Object).GetResourceVersion()
	w, err := k.client.watchOne(k.ctx, k.namespace, resource, name, rv)
	if err != nil {
		return err
	}
	defer w.Stop()
	*failures = 0
	for ev := range w.ResultChan() {
		switch ev.Type {
		case watch.Added, watch.Modified:
			seen(ev.Object)
		case watch.Deleted:
			seen(nil)
			return errStop
		case watch.Error:
			return apierrors.FromObject(ev.Object)
		}
		if k.ctx.Err() != nil {
			return errStop
		}
	}
	return nil
}
