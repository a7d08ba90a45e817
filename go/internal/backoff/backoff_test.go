package backoff

import (
	"context"
	"math"
	"testing"
	"time"
)

func TestTheFirstPauseIsBaseScaledByTheJitter(t *testing.T) {
	b := Backoff{Base: 200 * time.Millisecond, Cap: 3 * time.Second}
	for _, c := range []struct {
		attempt int
		jitter  float64
		want    time.Duration
	}{
		{1, 0, 100 * time.Millisecond},
		{1, 0.5, 150 * time.Millisecond},
		{1, 1, 200 * time.Millisecond},
		{0, 1, 200 * time.Millisecond},  // below 1 counts as 1
		{-5, 1, 200 * time.Millisecond}, // below 1 counts as 1
		{1, -1, 100 * time.Millisecond}, // jitter clamped to 0..1
		{1, 2, 200 * time.Millisecond},
	} {
		if got := b.Pause(c.attempt, c.jitter); got != c.want {
			t.Errorf("Pause(%d, %v) = %v, want %v", c.attempt, c.jitter, got, c.want)
		}
	}
}

func TestPausesDoubleUpToTheCap(t *testing.T) {
	b := Backoff{Base: 200 * time.Millisecond, Cap: 3 * time.Second}
	want := []time.Duration{200, 400, 800, 1600, 3000, 3000, 3000}
	for i, w := range want {
		if got := b.Pause(i+1, 1); got != w*time.Millisecond {
			t.Errorf("Pause(%d, 1) = %v, want %v", i+1, got, w*time.Millisecond)
		}
		if got, low := b.Pause(i+1, 0), w*time.Millisecond/2; got != low {
			t.Errorf("Pause(%d, 0) = %v, want %v", i+1, got, low)
		}
	}
}

func TestLargeAttemptsStayAtTheCap(t *testing.T) {
	for _, b := range []Backoff{
		{Base: 100 * time.Millisecond, Cap: 240 * time.Second},
		{Base: time.Second, Cap: 30 * time.Second},
		{Base: time.Nanosecond, Cap: math.MaxInt64},
		{Base: math.MaxInt64/2 + 1, Cap: math.MaxInt64},
	} {
		for _, attempt := range []int{64, 65, 1000, math.MaxInt} {
			if got := b.Pause(attempt, 1); got != b.Cap {
				t.Errorf("%+v: Pause(%d, 1) = %v, want the cap %v", b, attempt, got, b.Cap)
			}
			if got := b.Pause(attempt, 0); got < b.Cap/2-1 || got > b.Cap/2+1 {
				t.Errorf("%+v: Pause(%d, 0) = %v, want half the cap", b, attempt, got)
			}
		}
	}
}

func TestACapBelowTheBaseWins(t *testing.T) {
	b := Backoff{Base: 100 * time.Millisecond, Cap: 20 * time.Millisecond}
	if got := b.Pause(1, 1); got != 20*time.Millisecond {
		t.Errorf("Pause(1, 1) = %v, want the cap", got)
	}
}

func TestSleepEndsWithTheContext(t *testing.T) {
	if !Sleep(context.Background(), time.Millisecond) {
		t.Error("Sleep cut short without a cancellation")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	if Sleep(ctx, time.Hour) {
		t.Error("Sleep did not report the cancellation")
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Sleep took %v after the cancellation", d)
	}
}
