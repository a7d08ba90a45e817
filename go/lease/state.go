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

// tracker is the holder's view of its claim as a pure state machine over plain data and an
// explicit clock, so that the rules of I6 and I10 are unit-tested without a cluster:
//   - the local safe deadline is the send time of the last heartbeat the apiserver accepted,
//     plus the term's duration, minus the margin;
//   - the duration is the term's, fixed at grant (I10), as the claim or lease status says;
//     until it says, the smallest spec.leaseDurationSeconds seen since acquire;
//   - while holding, a heartbeat counts only when its answer arrives before the deadline;
//     once the deadline passes, or the claim or lease says otherwise, the hold is over;
//   - while waiting, the deadline passing ends nothing: the claim keeps its place. A grant
//     is believed only inside the deadline; one seen outside it waits for the next accepted
//     heartbeat.
type tracker struct {
	state        State
	claim        string
	lastRenew    bootInstant
	specDuration time.Duration
	term         time.Duration
	margin       time.Duration // 0: DefaultMargin of the duration
	callTimeout  time.Duration
	lease        *leaseView
	offered      int64 // a grant seen outside the deadline, awaiting an accepted heartbeat
}

func newTracker(claim string, sent bootInstant, spec, margin, callTimeout time.Duration) *tracker {
	return &tracker{claim: claim, lastRenew: sent, specDuration: spec, margin: margin, callTimeout: callTimeout}
}

func (t *tracker) duration() time.Duration {
	if t.term > 0 {
		return t.term
	}
	return t.specDuration
}

func (t *tracker) timing() timing { return newTiming(t.duration(), t.margin, t.callTimeout) }

func (t *tracker) deadline() bootInstant {
	tm := t.timing()
	return t.lastRenew.add(tm.duration - tm.margin)
}

func (t *tracker) live() bool    { return t.state.Phase != Lost }
func (t *tracker) holding() bool { return t.state.Phase == Holding }

// answered: the operator has granted or queued this claim.
func (t *tracker) answered() bool { return t.state.Phase != Waiting || t.state.QueuePosition > 0 }

// end ends the hold (if still live); reports whether anything changed.
func (t *tracker) end(reason LostReason, detail string) bool {
	if !t.live() {
		return false
	}
	t.state = State{Phase: Lost, Token: t.state.Token, Reason: reason, Detail: detail}
	return true
}

// checkDeadline ends a hold whose deadline has passed at now.
func (t *tracker) checkDeadline(now bootInstant) bool {
	if t.holding() && now >= t.deadline() {
		return t.end(DeadlinePassed, "")
	}
	return false
}

// tokenAt is the token if the lease is held at now (ok), else why not.
func (t *tracker) tokenAt(now bootInstant) (token int64, ok bool, reason LostReason, detail string) {
	switch {
	case t.holding() && now < t.deadline():
		return t.state.Token, true, 0, ""
	case t.holding():
		return 0, false, DeadlinePassed, ""
	case t.state.Phase == Lost:
		return 0, false, t.state.Reason, t.state.Detail
	}
	return 0, false, NotGranted, ""
}

// heartbeatOK: a heartbeat sent at sent was answered at received with claim.
func (t *tracker) heartbeatOK(sent, received bootInstant, claim claimView) bool {
	if t.checkDeadline(received) || !t.live() {
		return true
	}
	moved := sent > t.lastRenew
	if moved {
		t.lastRenew = sent
	}
	changed := t.observeClaim(claim, received) || moved
	if t.state.Phase == Waiting && t.offered > 0 {
		changed = t.tryGrant(t.offered, received) || changed
	}
	return changed
}
