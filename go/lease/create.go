package lease

import (
	"context"
	"time"

	"github.com/fenced-lease/fenced-lease/go/api/v1alpha1"
	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// claimRequest creates this holder's claim.
type claimRequest struct {
	client      *Client
	log         logr.Logger
	namespace   string
	lease       string
	identity    string
	pod         *PodRef
	callTimeout time.Duration
}

// create creates a claim under a fresh name; returns it and the send time of the first
// attempt that may have created it. A create whose answer was lost (timeout, reset, 5xx) is
// tried again under the same name: 409 then means an earlier attempt created it, and that
// claim is adopted (it keeps its place). Giving up, the claim is deleted by name in case it
// exists.
func (r *claimRequest) create(b *budget) (*v1alpha1.FencedLeaseClaim, bootInstant, error) {
	name := claimName(r.lease)
	var firstSent bootInstant
	uncertain := false
	for attempt := 1; ; attempt++ {
		sent := bootNow()
		claim := newClaim(r.namespace, name, r.lease, r.identity, r.pod, time.Now())
		created, err := call(b, "create FencedLeaseClaim", r.callTimeout, func(ctx context.Context) (*v1alpha1.FencedLeaseClaim, error) {
			return r.client.createClaim(ctx, claim)
		})
		if err == nil {
			if !uncertain {
				firstSent = sent
			}
			return created, firstSent, nil
		}
		if apierrors.IsAlreadyExists(err) || apierrors.IsConflict(err) {
			if uncertain {
				existing, aerr := r.adopt(b, name)
				if aerr != nil {
					r.withdraw(name)
					return nil, 0, aerr
				}
				if existing != nil {
					r.log.Info("an earlier create had succeeded; keeping that claim", "claim", name)
					return existing, firstSent, nil
				}
			}
			name, uncertain = claimName(r.lease), false // not ours, or over: another name
			continue
		}
		if !uncertain && (retryable(err) || b.ctx.Err() != nil) {
			firstSent, uncertain = sent, true // the request may have reached the apiserver
		}
		if perr := b.pause(attempt, err); perr != nil {
			if uncertain {
				r.withdraw(name)
			}
			return nil, 0, perr
		}
	}
}

// adopt is the claim name an earlier attempt may have created, if it is this holder's and
// not over; a claim of ours that is over is deleted.
func (r *claimRequest) adopt(b *budget, name string) (*v1alpha1.FencedLeaseClaim, error) {
	found, err := retry(b, "get FencedLeaseClaim", r.callTimeout, func(ctx context.Context) (*v1alpha1.FencedLeaseClaim, error) {
		return r.client.getClaim(ctx, r.namespace, name)
	})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if found.Spec.LeaseName != r.lease || found.Spec.HolderIdentity != r.identity {
		return nil, nil
	}
	if s := found.Status; s != nil && (s.Phase == v1alpha1.ClaimExpired || s.Phase == v1alpha1.ClaimRevoked) {
		r.withdraw(name)
		return nil, nil
	}
	return found, nil
}

// withdraw deletes claim name if it exists (best effort: a claim nobody heartbeats is
// expired by the operator).
func (r *claimRequest) withdraw(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), r.callTimeout)
	defer cancel()
	err := r.client.deleteClaim(ctx, r.namespace, name)
	switch {
	case err == nil:
		r.log.Info("withdrew a claim whose create was uncertain", "claim", name)
	case !apierrors.IsNotFound(err):
		r.log.Info("could not withdraw a claim whose create was uncertain", "claim", name, "error", err.Error())
	}
}
