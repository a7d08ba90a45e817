package lease

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestIdentityIsPodThenHostnameThenHolderWithAPerProcessSuffix(t *testing.T) {
	for _, c := range []struct{ pod, host, want string }{
		{"web-0", "node", "web-0-3f9a1c2e"},
		{"", "node", "node-3f9a1c2e"},
		{"", "", "holder-3f9a1c2e"},
	} {
		if got := identityFrom(c.pod, c.host, 0x3f9a1c2e); got != c.want {
			t.Errorf("identityFrom(%q, %q) = %q, want %q", c.pod, c.host, got, c.want)
		}
	}
	long := identityFrom(strings.Repeat("p", 300), "", 1)
	if len(long) != maxIdentityLen || !strings.HasSuffix(long, "p-00000001") {
		t.Errorf("long identity %d bytes: %q", len(long), long[len(long)-12:])
	}
	if DefaultIdentity() != DefaultIdentity() {
		t.Error("DefaultIdentity changes within a process")
	}
}

func TestPodComesFromTheDownwardAPIInTheSameNamespaceOnly(t *testing.T) {
	env := func(ns string) func(string) string {
		return func(k string) string {
			return map[string]string{"POD_NAME": "web-0", "POD_UID": "1234", "POD_NAMESPACE": ns}[k]
		}
	}
	none := func() string { return "" }
	if p := podFrom("prod", env("prod"), none); p == nil || *p != (PodRef{"web-0", "1234"}) {
		t.Errorf("same namespace: %+v", p)
	}
	if p := podFrom("prod", env(""), none); p == nil {
		t.Error("no namespace said: the pod must count")
	}
	if p := podFrom("prod", env("other"), none); p != nil {
		t.Errorf("other namespace: %+v", p)
	}
	if p := podFrom("prod", env(""), func() string { return "other\n" }); p != nil {
		t.Errorf("the ServiceAccount mount says another namespace: %+v", p)
	}
	if p := podFrom("prod", func(string) string { return "" }, none); p != nil {
		t.Errorf("outside a pod: %+v", p)
	}
}

func TestRenewsThreeTimesPerDurationWithATenthAsMargin(t *testing.T) {
	tm := newTiming(15*time.Second, 0, 0)
	if tm.renewEvery != 5*time.Second || tm.margin != 1500*time.Millisecond || tm.callTimeout != 5*time.Second {
		t.Errorf("timing %+v", tm)
	}
	if DefaultMargin(time.Second) != 100*time.Millisecond || DefaultMargin(time.Hour) != 2*time.Second {
		t.Error("the default margin is not bounded to 100ms..2s")
	}
	if got := tm.retryAfter(1, 1); got != 100*time.Millisecond {
		t.Errorf("first retry after %v", got)
	}
	if got := tm.retryAfter(30, 1); got != time.Second {
		t.Errorf("retries capped at %v, want a fifth of the renew period", got)
	}
	if got := newTiming(time.Hour, 0, 0).retryAfter(30, 1); got != maxHeartbeatRetry {
		t.Errorf("retries on an hour's lease capped at %v, want %v", got, maxHeartbeatRetry)
	}
	if got := newTiming(100*time.Millisecond, 0, 0).retryAfter(1, 0); got != 10*time.Millisecond {
		t.Errorf("first retry on a 100ms lease after %v, want half of 20ms", got)
	}
}

// The deadline clock counts suspend: it agrees with /proc/uptime (time since boot, suspend
// included), which CLOCK_MONOTONIC does not once the machine has been suspended.
func TestTheDeadlineClockIsBoottime(t *testing.T) {
	raw, err := os.ReadFile("/proc/uptime")
	if err != nil {
		t.Fatal(err)
	}
	uptime, err := strconv.ParseFloat(strings.Fields(string(raw))[0], 64)
	if err != nil {
		t.Fatal(err)
	}
	if diff := time.Duration(bootNow()).Seconds() - uptime; diff < -1 || diff > 1 {
		t.Errorf("boot clock %v vs /proc/uptime %.2fs", time.Duration(bootNow()), uptime)
	}
	a := bootNow()
	time.Sleep(10 * time.Millisecond)
	if d := bootNow().since(a); d < 10*time.Millisecond || d > time.Second {
		t.Errorf("boot clock moved %v over a 10ms sleep", d)
	}
}
