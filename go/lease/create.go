package lease

import (
	"context"
	"encoding/json"
	"maps"
	"sync"
	"time"

	"github.com/fenced-lease/fenced-lease/go/api/v1alpha1"
	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// creators holds, per Client (one per process), the creator annotations of its claims (I7):
// its username and, from a pod, the pod's name and UID, as the apiserver authenticates it —
// learned once from a SelfSubjectReview, which every authenticated user may create. The
// claim-ownership policy refuses a claim whose annotations are not its creator's; where the
// apiserver serves MutatingAdmissionPolicy (1.36 on) the chart's policy overwrites them with
// the same values.
var creators sync.Map // *Client -> map[string]string

// creator is the creator annotations of the claims r.client makes.
func (r *claimRequest) creator(b *budget) (map[string]string, error) {
	if known, ok := creators.Load(r.client); ok {
		return known.(map[string]string), nil
	}
	review, err := retry(b, "create SelfSubjectReview", r.callTimeout, func(ctx context.Context) (*authenticationv1.SelfSubjectReview, error) {
		body := []byte(`{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}`)
		raw, err := r.client.rest.Post().AbsPath("/apis/authentication.k8s.io/v1/selfsubjectreviews").
			SetHeader("Content-Type", "application/json").Body(body).Do(ctx).Raw()
		if err != nil {
			return nil, err
		}
		out := &authenticationv1.SelfSubjectReview{}
		return out, json.Unmarshal(raw, out)
	})
	if err != nil {
		return nil, err
	}
	user := review.Status.UserInfo
	annotations := map[string]string{"fencing.dev/created-by": user.Username}
	pod, uid := user.Extra["authentication.kubernetes.io/pod-name"], user.Extra["authentication.kubernetes.io/pod-uid"]
	if len(pod) > 0 && len(uid) > 0 {
		annotations["fencing.dev/created-by-pod"] = pod[0]
		annotations["fencing.dev/created-by-pod-uid"] = uid[0]
	}
	creators.Store(r.client, annotations)
	return annotations, nil
}

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
	creator, err := r.creator(b)
	if err != nil {
		return nil, 0, err
	}
	name := claimName(r.lease)
	var firstSent bootInstant
	uncertain := false
	for attempt := 1; ; attempt++ {
		sent := bootNow()
		claim := newClaim(r.namespace, name, r.lease, r.identity, r.pod, time.Now())
		claim.Annotations = maps.Clone(creator)
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
