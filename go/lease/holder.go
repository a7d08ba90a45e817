package lease

import (
	"context"
	"errors"
	"time"

	"github.com/fenced-lease/fenced-lease/go/api/v1alpha1"
	"github.com/fenced-lease/fenced-lease/go/internal/backoff"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/watch"
)

// WatchHolder calls changed with the identity of the lease's holder as its status names it
// ("" when nobody holds it or the lease is gone) each time it changes, until ctx is done.
// API errors are retried with jittered backoff. It is what OnNewLeader is made of.
func (c *Client) WatchHolder(ctx context.Context, namespace, name string, changed func(identity string)) {
	last, first, failures := "", true, 0
	report := func(l *v1alpha1.FencedLease) {
		holder := ""
		if l != nil && l.Status != nil && l.Status.Holder != nil {
			holder = l.Status.Holder.Identity
		}
		if first || holder != last {
			first, last = false, holder
			changed(holder)
		}
	}
	for ctx.Err() == nil {
		err := c.watchHolderOnce(ctx, namespace, name, report)
		if err == nil {
			failures = 0
			continue
		}
		failures++
		if !backoff.Sleep(ctx, watchBackoff.Pause(failures, randFloat())) {
			return
		}
	}
}

func (c *Client) watchHolderOnce(ctx context.Context, ns, name string, report func(*v1alpha1.FencedLease)) error {
	call, cancel := context.WithTimeout(ctx, 10*time.Second)
	l, err := c.getLease(call, ns, name)
	cancel()
	rv := ""
	switch {
	case apierrors.IsNotFound(err):
		report(nil)
	case err != nil:
		return err
	default:
		report(l)
		rv = l.ResourceVersion
	}
	w, err := c.watchOne(ctx, ns, v1alpha1.LeasesResource, name, rv)
	if err != nil {
		return err
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		switch ev.Type {
		case watch.Added, watch.Modified:
			if l, ok := ev.Object.(*v1alpha1.FencedLease); ok {
				report(l)
			}
		case watch.Deleted:
			report(nil)
		case watch.Error:
			return apierrors.FromObject(ev.Object)
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	return errors.New("watch closed")
}
