package lease

import (
	"fmt"

	"github.com/fenced-lease/fenced-lease/go/api/v1alpha1"
)

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
