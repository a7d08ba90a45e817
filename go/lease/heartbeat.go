package lease

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/fenced-lease/fenced-lease/go/api/v1alpha1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// finalPhaseMessage is the CRD rule's message when a heartbeat hits a claim that is over:
// spec.renewTime is frozen once the phase is Expired or Revoked (I9).
const finalPhaseMessage = "the claim has Expired or was Revoked"

// heartbeatPatch writes now into spec.renewTime. Any new value will do: the operator times
// expiry from when it sees the value change.
func heartbeatPatch(now time.Time) []byte {
	t := metav1.NewMicroTime(now.UTC())
	b, _ := json.Marshal(map[string]any{"spec": map[string]any{"renewTime": t}})
	return b
}

func isFinalPhaseRefusal(err error) bool {
	return apierrors.IsInvalid(err) && strings.Contains(err.Error(), finalPhaseMessage)
}

// heartbeat renews every renewEvery from the send time of the last accepted heartbeat;
// retries failures with jittered backoff (or the apiserver's Retry-After); never waits for
// an answer past the deadline while holding. A refusal that cannot change by waiting ends
// the claim at once: 404 (deleted), 403 (forbidden), 422 from the final-phase rule.
//
// A waiting claim whose heartbeats did not get through for longer than its deadline may have
// been granted, expired and replaced meanwhile: the first heartbeat accepted after such a gap
// is counted together with a fresh read of the lease made after it.
func (k *keeper) heartbeat() {
	defer k.wg.Done()
	lastSentAt := time.Now()
	next := lastSentAt.Add(k.timing().renewEvery)
	failures := 0
	for {
		_, changed := k.snapshot()
		timer := time.NewTimer(time.Until(next))
		select {
		case <-k.ctx.Done():
			timer.Stop()
			return
		case <-changed:
			timer.Stop()
			// The duration in force can shorten while this sleeps (a claim that queued on a
			// longer spec is granted a shorter term, I10): pace on the term from now on.
			if n := lastSentAt.Add(k.timing().renewEvery); n.Before(next) {
				next = n
			}
			continue
		case <-timer.C:
		}
		lastSentAt = time.Now()
		err := k.beat()
		if err == nil {
			failures = 0
			next = lastSentAt.Add(k.timing().renewEvery)
			continue
		}
		if errors.Is(err, errClaimOver) {
			return
		}
		failures++
		tm := k.timing()
		pause := max(tm.retryAfter(failures, randFloat()), min(retryAfter(err), tm.renewEvery))
		if failures == 1 {
			k.log.Info("heartbeat failed; retrying", "error", err.Error(), "pause", pause)
		} else {
			k.log.V(1).Info("heartbeat failed; retrying", "error", err.Error(), "failures", failures)
		}
		next = time.Now().Add(pause)
	}
}

var errClaimOver = errors.New("the claim is over")

// beat sends one heartbeat and records its answer; errClaimOver when the claim is over.
func (k *keeper) beat() error {
	sent := bootNow()
	k.checkDeadline(sent)
	t, _ := k.snapshot()
	if !t.live() {
		return errClaimOver
	}
	tm, holding, deadline := t.timing(), t.holding(), t.deadline()
	budget := tm.callTimeout
	if holding {
		budget = min(budget, deadline.since(sent))
	}
	ctx, cancel := context.WithTimeout(k.ctx, budget)
	claim, err := k.client.patchClaim(ctx, k.namespace, k.claim, heartbeatPatch(time.Now()))
	cancel()
	received := bootNow()
	if k.ctx.Err() != nil {
		return errClaimOver
	}
	var lease *leaseView
	fresh := err == nil && !holding && sent >= deadline
	if fresh {
		lease, err = k.readLease(tm)
	}
	switch {
	case err == nil:
		k.update(func(t *tracker) bool {
			seen := fresh && t.observeLease(lease, received)
			return t.heartbeatOK(sent, received, viewClaim(claim)) || seen
		})
		return nil
	case apierrors.IsNotFound(err):
		k.end(ClaimDeleted, "")
		return errClaimOver
	case apierrors.IsForbidden(err):
		k.log.Info("heartbeat forbidden", "error", err.Error())
		k.end(Forbidden, err.Error())
		return errClaimOver
	case isFinalPhaseRefusal(err):
		reason, detail := k.finalReason(tm)
		k.log.Info("heartbeat refused: the claim is over", "reason", reason.String())
		k.end(reason, detail)
		return errClaimOver
	case ctx.Err() != nil:
		return timedOut("renew FencedLeaseClaim", budget)
	}
	return fromAPI("renew FencedLeaseClaim", err)
}

// readLease is the lease as it is now (nil: deleted), as a view.
func (k *keeper) readLease(tm timing) (*leaseView, error) {
	ctx, cancel := context.WithTimeout(k.ctx, tm.callTimeout)
	defer cancel()
	l, err := k.client.getLease(ctx, k.namespace, k.lease)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	v := viewLease(l)
	return &v, nil
}

// finalReason says why a claim whose heartbeat the final-phase rule refused is over:
// Revoked if a read says so, else Expired.
func (k *keeper) finalReason(tm timing) (LostReason, string) {
	ctx, cancel := context.WithTimeout(k.ctx, tm.callTimeout)
	defer cancel()
	c, err := k.client.getClaim(ctx, k.namespace, k.claim)
	if err == nil && c.Status != nil && c.Status.Phase == v1alpha1.ClaimRevoked {
		return Revoked, c.Status.Message
	}
	return Expired, ""
}
