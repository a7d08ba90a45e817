package lock

import (
	"testing"
	"time"
)

// The elector believes it leads up to RetryPeriod + RenewDeadline after an accepted Update,
// so Update needs more than that, and one RetryPeriod of slack, before the local safe
// deadline.
func TestUpdateNeedsTheElectorsWholeBeliefBeforeTheDeadline(t *testing.T) {
	tm := Timing{LeaseDuration: 3 * time.Second, RenewDeadline: time.Second, RetryPeriod: 200 * time.Millisecond}
	for left, want := range map[time.Duration]bool{
		0: false, 1200 * time.Millisecond: false, 1400 * time.Millisecond: false, 1401 * time.Millisecond: true, 2 * time.Second: true,
	} {
		if got := tm.mayRenew(left); got != want {
			t.Errorf("mayRenew(%v) = %v, want %v", left, got, want)
		}
	}
	if tm.window() != 1400*time.Millisecond {
		t.Errorf("window %v", tm.window())
	}
}

// Every default timing passes its own check, and leaves room for late renews.
func TestDefaultTimingFitsTheLease(t *testing.T) {
	for _, d := range []time.Duration{time.Second, 2 * time.Second, 3 * time.Second, 15 * time.Second, time.Minute, time.Hour} {
		tm := DefaultTiming(d, 0)
		if err := tm.Check(d, 0); err != nil {
			t.Errorf("%v: %v", d, err)
		}
		if 2*(tm.RenewDeadline+tm.RetryPeriod) > Room(d, 0) {
			t.Errorf("%v: %+v leaves less than half the room %v for late renews", d, tm, Room(d, 0))
		}
	}
}

// client-go's defaults (15 s, 10 s, 2 s) would let the elector believe it leads past the
// local safe deadline of a 15 s FencedLease (room 15 − 5 − 1.5 = 8.5 s): refused, as are
// the elector's own impossible settings.
func TestTimingThatOutlivesTheDeadlineIsRefused(t *testing.T) {
	d := 15 * time.Second
	if got := Room(d, 0); got != 8500*time.Millisecond {
		t.Fatalf("Room(15s) = %v", got)
	}
	for _, tm := range []Timing{
		{LeaseDuration: d, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second},
		{LeaseDuration: d, RenewDeadline: 7 * time.Second, RetryPeriod: 1500 * time.Millisecond},
		{LeaseDuration: d, RenewDeadline: 6 * time.Second, RetryPeriod: 2 * time.Second},
		{LeaseDuration: time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: time.Second / 2},
		{LeaseDuration: d, RenewDeadline: time.Second, RetryPeriod: time.Second},
		{LeaseDuration: d, RenewDeadline: time.Second},
	} {
		if err := tm.Check(d, 0); err == nil {
			t.Errorf("%+v accepted", tm)
		}
	}
	ok := Timing{LeaseDuration: d, RenewDeadline: 5 * time.Second, RetryPeriod: time.Second}
	if err := ok.Check(d, 0); err != nil {
		t.Errorf("%+v: %v", ok, err)
	}
	if err := DefaultTiming(time.Second, 0).Check(time.Second, 900*time.Millisecond); err == nil {
		t.Error("a margin that leaves no room accepted")
	}
}
