package lease

import (
	"fmt"
	"time"

	"github.com/fenced-lease/fenced-lease/go/api/v1alpha1"
)

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

// observeClaim: the claim's status as read at now. Only terminal phases end a hold, so an
// older event arriving late cannot end it by mistake.
func (t *tracker) observeClaim(claim claimView, now bootInstant) bool {
	if t.checkDeadline(now) || !t.live() {
		return true
	}
	changed := false
	if claim.phase == v1alpha1.ClaimGranted && claim.term > 0 && t.term != claim.term {
		t.term = claim.term
		changed = true
		if t.checkDeadline(now) {
			return true
		}
	}
	switch {
	case claim.phase == v1alpha1.ClaimExpired:
		return t.end(Expired, "")
	case claim.phase == v1alpha1.ClaimRevoked:
		return t.end(Revoked, claim.message)
	case t.state.Phase != Waiting:
		return changed
	case claim.phase == v1alpha1.ClaimGranted:
		if claim.token > 0 {
			return t.tryGrant(claim.token, now) || changed
		}
		return changed
	case claim.leaseMissing:
		return t.end(LeaseDeleted, "")
	case claim.queuePosition > 0 && claim.queuePosition != t.state.QueuePosition:
		t.state.QueuePosition = claim.queuePosition
		return true
	}
	return changed
}

// observeLease: the lease as read at now; nil when it is gone. A grant shows here first.
// While holding, only a newer token or another holder at the same token ends the hold.
func (t *tracker) observeLease(lease *leaseView, now bootInstant) bool {
	if t.checkDeadline(now) || !t.live() {
		return true
	}
	if lease == nil {
		return t.end(LeaseDeleted, "")
	}
	namesMe := lease.holderClaim == t.claim
	changed := false
	// Until the term's duration is known, never trust a larger spec than seen before.
	if t.term == 0 && lease.specDuration < t.specDuration {
		t.specDuration = lease.specDuration
		changed = true
	}
	if namesMe && lease.term > 0 && t.term != lease.term {
		t.term = lease.term
		changed = true
	}
	seen := *lease
	t.lease = &seen
	if t.checkDeadline(now) {
		return true
	}
	switch {
	case t.state.Phase == Waiting && namesMe:
		return t.tryGrant(lease.token, now) || changed
	case t.holding() && t.superseded(t.state.Token):
		return t.end(Superseded, supersededBy(lease))
	}
	return changed
}

func supersededBy(l *leaseView) string {
	if l == nil {
		return ""
	}
	if l.holderClaim == "" {
		return fmt.Sprintf("nobody holds it; lease token %d", l.token)
	}
	return fmt.Sprintf("now held by claim %s with token %d", l.holderClaim, l.token)
}

// superseded: the lease as last seen shows token is no longer this claim's.
func (t *tracker) superseded(token int64) bool {
	l := t.lease
	return l != nil && (l.token > token || (l.token == token && l.holderClaim != t.claim))
}

// tryGrant: the operator granted token to this claim, as seen at now.
func (t *tracker) tryGrant(token int64, now bootInstant) bool {
	if t.superseded(token) {
		return t.end(Superseded, supersededBy(t.lease))
	}
	if d := t.duration(); t.margin >= d {
		t.state.Token = 0
		return t.end(MarginTooLarge, fmt.Sprintf("term %v, margin %v", d, t.margin))
	}
	if now >= t.deadline() {
		// Granted while its heartbeats were not getting through: the term may have run out
		// already. Believe it once a heartbeat is accepted again.
		changed := t.offered != token
		t.offered = token
		return changed
	}
	t.offered = 0
	t.state = State{Phase: Holding, Token: token}
	return true
}
