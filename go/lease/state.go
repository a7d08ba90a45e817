package lease

import (
	"time"

	"github.com/fenced-lease/fenced-lease/go/api/v1alpha1"
)

// Phase is where a claim stands, as its holder sees it.
type Phase int

const (
	// Waiting means queued, not granted yet.
	Waiting Phase = iota
	// Holding means granted, and inside the local safe deadline.
	Holding
	// Lost means over, for good.
	Lost
)

// State is a claim's hold state.
type State struct {
	// Phase is Waiting, Holding or Lost.
	Phase Phase
	// Token is the fencing token granted (0 while Waiting, and when Lost before a grant).
	Token int64
	// QueuePosition is the place in the queue while Waiting (1 = next; 0 = not said yet).
	QueuePosition int32
	// Reason says why the hold is Lost.
	Reason LostReason
	// Detail adds what the apiserver or the lease said about the loss.
	Detail string
}

// claimView is what a holder needs from its claim's status.
type claimView struct {
	phase         v1alpha1.ClaimPhase
	token         int64 // 0: none
	queuePosition int32
	message       string
	leaseMissing  bool          // LeaseFound condition False
	term          time.Duration // the term's duration, fixed at grant (I10); 0: not said
}

// leaseView is what a holder needs from the lease, whose status is the source of truth.
type leaseView struct {
	holderClaim    string
	holderIdentity string
	token          int64
	specDuration   time.Duration // spec.leaseDurationSeconds: the next term's
	term           time.Duration // status.leaseDurationSeconds: the running term's; 0: not said
}

func seconds(s int32) time.Duration { return time.Duration(max(s, 1)) * time.Second }

func viewClaim(c *v1alpha1.FencedLeaseClaim) claimView {
	if c == nil || c.Status == nil {
		return claimView{}
	}
	s := c.Status
	v := claimView{phase: s.Phase, message: s.Message}
	if s.FencingToken != nil {
		v.token = *s.FencingToken
	}
	if s.QueuePosition != nil {
		v.queuePosition = *s.QueuePosition
	}
	if s.LeaseDurationSeconds != nil {
		v.term = seconds(*s.LeaseDurationSeconds)
	}
	for _, cond := range s.Conditions {
		if cond.Type == "LeaseFound" && cond.Status == "False" {
			v.leaseMissing = true
		}
	}
	return v
}

func viewLease(l *v1alpha1.FencedLease) leaseView {
	v := leaseView{specDuration: seconds(l.Spec.LeaseDurationSeconds)}
	if l.Spec.LeaseDurationSeconds == 0 {
		v.specDuration = v1alpha1.DefaultLeaseDurationSeconds * time.Second
	}
	if s := l.Status; s != nil {
		v.token = s.FencingToken
		if s.Holder != nil {
			v.holderClaim, v.holderIdentity = s.Holder.Claim, s.Holder.Identity
		}
		if s.LeaseDurationSeconds != nil {
			v.term = seconds(*s.LeaseDurationSeconds)
		}
	}
	return v
}
