package lease

import (
	"context"
	"time"

	"github.com/fenced-lease/fenced-lease/go/api/v1alpha1"
	"k8s.io/apimachinery/pkg/runtime"
)

// WatchHolder calls changed with the identity of the lease's holder as its status names it
// ("" when nobody holds it or the lease is gone) each time it changes, until ctx is done.
// API errors are retried with jittered backoff. It is what OnNewLeader is made of.
func (c *Client) WatchHolder(ctx context.Context, namespace, name string, changed func(identity string)) {
	last, first := "", true
	get := func(ctx context.Context) (runtime.Object, error) {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return c.getLease(ctx, namespace, name)
	}
	seen := func(obj runtime.Object) bool {
		holder := ""
		if obj != nil {
			l, ok := obj.(*v1alpha1.FencedLease)
			if !ok {
				return true
			}
			if l.Status != nil && l.Status.Holder != nil {
				holder = l.Status.Holder.Identity
			}
		}
		if first || holder != last {
			first, last = false, holder
			changed(holder)
		}
		return true
	}
	c.followObject(ctx, namespace, v1alpha1.LeasesResource, name, nil, get, seen, nil)
}
