package lease

import (
	"testing"
	"time"

	"github.com/fenced-lease/fenced-lease/go/api/v1alpha1"
)

const (
	testD  = 10 * time.Second
	testM  = time.Second
	testMe = "db-abcde"
)

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func testTracker(t0 bootInstant) *tracker { return newTracker(testMe, t0, testD, testM, 0) }

func granted(token int64) claimView {
	return claimView{phase: v1alpha1.ClaimGranted, token: token}
}

func pending(pos int32) claimView {
	return claimView{phase: v1alpha1.ClaimPending, queuePosition: pos}
}

func leaseOf(holder string, token int64) *leaseView {
	return &leaseView{holderClaim: holder, token: token, specDuration: testD}
}

func wantToken(t *testing.T, tr *tracker, at bootInstant, want int64) {
	t.Helper()
	got, ok, reason, _ := tr.tokenAt(at)
	if !ok || got != want {
		t.Fatalf("token = %d (held %v, %v), want %d", got, ok, reason, want)
	}
}

func wantLost(t *testing.T, tr *tracker, at bootInstant, want LostReason) {
	t.Helper()
	_, ok, reason, _ := tr.tokenAt(at)
	if ok || reason != want {
		t.Fatalf("held %v, reason %v; want not held: %v", ok, reason, want)
	}
}

func TestGrantInsideTheDeadlineHoldsUntilDurationMinusMarginAfterTheLastSend(t *testing.T) {
	t0 := bootNow()
	tr := testTracker(t0)
	if !tr.observeClaim(granted(7), t0.add(secs(1))) {
		t.Fatal("the grant changed nothing")
	}
	wantToken(t, tr, t0.add(secs(8.999)), 7)
	wantLost(t, tr, t0.add(secs(9)), DeadlinePassed)
}

func TestACountedHeartbeatMovesTheDeadlineFromItsSendTime(t *testing.T) {
	t0 := bootNow()
	tr := testTracker(t0)
	tr.observeClaim(granted(3), t0)
	tr.heartbeatOK(t0.add(secs(3)), t0.add(secs(3.5)), granted(3))
	if tr.deadline() != t0.add(secs(12)) {
		t.Fatalf("deadline %v after t0, want 12s", tr.deadline().since(t0))
	}
	wantToken(t, tr, t0.add(secs(11.9)), 3)
}

func TestAHeartbeatAnsweredAfterTheDeadlineDoesNotReviveTheHold(t *testing.T) {
	t0 := bootNow()
	tr := testTracker(t0)
	tr.observeClaim(granted(3), t0)
	tr.heartbeatOK(t0.add(secs(8.5)), t0.add(secs(9.2)), granted(3))
	if tr.state.Phase != Lost || tr.state.Reason != DeadlinePassed || tr.state.Token != 3 {
		t.Fatalf("state %+v, want lost at the deadline with token 3", tr.state)
	}
	tr.heartbeatOK(t0.add(secs(9.4)), t0.add(secs(9.5)), granted(3))
	if tr.live() {
		t.Fatal("a later success revived the hold")
	}
}

func TestAWaitingClaimKeepsItsPlacePastItsDeadlineAndALateGrantWaitsForAHeartbeat(t *testing.T) {
	t0 := bootNow()
	tr := testTracker(t0)
	tr.observeClaim(pending(2), t0.add(secs(1)))
	if tr.checkDeadline(t0.add(secs(30))) || tr.state.Phase != Waiting || tr.state.QueuePosition != 2 {
		t.Fatalf("state %+v, want waiting at 2", tr.state)
	}
	tr.observeLease(leaseOf(testMe, 5), t0.add(secs(31)))
	if tr.state.Phase != Waiting {
		t.Fatalf("a grant seen outside the deadline was believed: %+v", tr.state)
	}
	tr.heartbeatOK(t0.add(secs(32)), t0.add(secs(32.1)), pending(1))
	wantToken(t, tr, t0.add(secs(32.2)), 5)
	if tr.deadline() != t0.add(secs(41)) {
		t.Fatalf("deadline %v after t0, want 41s", tr.deadline().since(t0))
	}
}

func TestAGrantOlderThanTheLeaseSeenIsRefused(t *testing.T) {
	t0 := bootNow()
	tr := testTracker(t0)
	tr.observeLease(leaseOf("db-other", 6), t0)
	tr.heartbeatOK(t0.add(secs(1)), t0.add(secs(1.1)), granted(5))
	if tr.state.Phase != Lost || tr.state.Reason != Superseded {
		t.Fatalf("state %+v, want superseded", tr.state)
	}
}

func TestTerminalPhasesEndTheHoldForGood(t *testing.T) {
	t0 := bootNow()
	tr := testTracker(t0)
	tr.observeClaim(granted(2), t0)
	tr.observeClaim(claimView{phase: v1alpha1.ClaimExpired, token: 2}, t0.add(secs(1)))
	wantLost(t, tr, t0.add(secs(1)), Expired)
	tr.observeClaim(granted(2), t0.add(secs(1.1)))
	wantLost(t, tr, t0.add(secs(1.2)), Expired)

	tr = testTracker(t0)
	tr.observeClaim(claimView{phase: v1alpha1.ClaimRevoked, message: "pod web-0 deleted"}, t0)
	wantLost(t, tr, t0, Revoked)
	if tr.state.Detail != "pod web-0 deleted" {
		t.Fatalf("detail %q", tr.state.Detail)
	}
}

func TestALatePendingEventDoesNotEndAHold(t *testing.T) {
	t0 := bootNow()
	tr := testTracker(t0)
	tr.observeClaim(granted(4), t0)
	tr.observeClaim(pending(1), t0.add(secs(0.1)))
	wantToken(t, tr, t0.add(secs(0.2)), 4)
}

func TestWaitingTracksTheQueuePositionAndKnowsWhenTheOperatorAnswered(t *testing.T) {
	t0 := bootNow()
	tr := testTracker(t0)
	if tr.answered() {
		t.Fatal("answered before any answer")
	}
	if !tr.observeClaim(pending(3), t0) || !tr.answered() || tr.observeClaim(pending(3), t0) {
		t.Fatalf("queue position not tracked: %+v", tr.state)
	}
	tr = testTracker(t0)
	tr.observeLease(leaseOf("db-other", 4), t0)
	if tr.answered() {
		t.Fatal("the lease naming another holder is no answer")
	}
	tr.observeLease(leaseOf(testMe, 5), t0)
	if !tr.answered() {
		t.Fatal("the lease naming this claim is an answer")
	}
}

func TestTheLeaseStatusGrantsFirstAndEndsTheHoldOnANewerToken(t *testing.T) {
	t0 := bootNow()
	tr := testTracker(t0)
	before := leaseOf("db-other", 6)
	if tr.observeLease(before, t0) {
		t.Fatal("another holder changed the state")
	}
	tr.observeLease(leaseOf(testMe, 7), t0)
	wantToken(t, tr, t0, 7)
	tr.observeLease(before, t0) // late event from before the grant
	wantToken(t, tr, t0, 7)
	tr.observeLease(leaseOf("", 7), t0)
	wantLost(t, tr, t0, Superseded)
}

func TestANewerHolderOrADeletedLeaseEndsTheHold(t *testing.T) {
	t0 := bootNow()
	tr := testTracker(t0)
	tr.observeClaim(granted(7), t0)
	tr.observeLease(leaseOf("db-next", 8), t0)
	wantLost(t, tr, t0, Superseded)

	tr = testTracker(t0)
	tr.observeClaim(granted(7), t0)
	tr.observeLease(nil, t0)
	wantLost(t, tr, t0, LeaseDeleted)

	tr = testTracker(t0)
	tr.observeClaim(claimView{leaseMissing: true}, t0)
	wantLost(t, tr, t0, LeaseDeleted)
}

func TestReleaseIsFinal(t *testing.T) {
	t0 := bootNow()
	tr := testTracker(t0)
	tr.observeClaim(granted(1), t0)
	if !tr.end(Released, "") || tr.end(Expired, "") {
		t.Fatal("end is not final")
	}
	wantLost(t, tr, t0, Released)
}

// I10: a lease edited from 3600 s to 10 s while the claim waits, then granted: the holder
// believes it holds for the term's 10 s, not the hour it read at acquire.
func TestI10TheDeadlineFollowsTheTermsDurationNotTheSpecReadAtAcquire(t *testing.T) {
	hour := time.Hour
	t0 := bootNow()
	grantedFor := func(s int) claimView {
		v := granted(4)
		v.term = time.Duration(s) * time.Second
		return v
	}
	tr := newTracker(testMe, t0, hour, testM, 0)
	tr.observeClaim(grantedFor(10), t0.add(secs(0.5)))
	wantToken(t, tr, t0.add(secs(8.9)), 4)
	wantLost(t, tr, t0.add(secs(9)), DeadlinePassed)

	tr = newTracker(testMe, t0, hour, testM, 0)
	mine := leaseOf(testMe, 4)
	mine.term, mine.specDuration = testD, hour
	tr.observeLease(mine, t0)
	if tr.deadline() != t0.add(secs(9)) {
		t.Fatalf("deadline %v, want 9s", tr.deadline().since(t0))
	}

	tr = newTracker(testMe, t0, testD, testM, 0)
	tr.observeClaim(grantedFor(60), t0)
	edited := leaseOf(testMe, 4)
	edited.specDuration = 5 * time.Second
	tr.observeLease(edited, t0)
	if tr.deadline() != t0.add(secs(59)) {
		t.Fatalf("a spec edit changed the running term: deadline %v", tr.deadline().since(t0))
	}

	tr = newTracker(testMe, t0, hour, testM, 0)
	spec := func(s int) *leaseView {
		v := leaseOf("db-other", 3)
		v.specDuration = time.Duration(s) * time.Second
		return v
	}
	tr.observeLease(spec(10), t0)
	tr.observeLease(spec(3600), t0)
	tr.observeClaim(granted(4), t0)
	if tr.deadline() != t0.add(secs(9)) || tr.timing().renewEvery != secs(10.0/3) {
		t.Fatalf("without a term, the smallest spec seen must count: deadline %v", tr.deadline().since(t0))
	}
}

func TestATermNotLongerThanTheMarginIsRefused(t *testing.T) {
	t0 := bootNow()
	tr := newTracker(testMe, t0, testD, 5*time.Second, 0)
	v := granted(4)
	v.term = 5 * time.Second
	tr.observeClaim(v, t0)
	wantLost(t, tr, t0, MarginTooLarge)
}
