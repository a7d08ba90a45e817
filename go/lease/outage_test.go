package lease_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fenced-lease/fenced-lease/go/internal/testenv"
	"github.com/fenced-lease/fenced-lease/go/lease"
)

// A holder behind a proxy rides out an apiserver blip shorter than its deadline: it never
// stops holding, and keeps its token.
func TestAHolderRidesOutAnAPIServerBlip(t *testing.T) {
	e := setup(t, "go-blip", "db", 6)
	ctx := testenv.Ctx(t, 2*time.Minute)
	proxy, through := testenv.NewProxy(t, e.cfg)
	l, err := lease.Acquire(ctx, newClient(t, through), e.ns, "db", lease.Options{Identity: "blip", Wait: wait})
	if err != nil {
		t.Fatal(err)
	}
	tok := token(t, l)
	proxy.Cut()
	cutUntil := time.Now().Add(3 * time.Second)
	for time.Now().Before(cutUntil) {
		if !l.Held() {
			t.Fatalf("lost during a 3s blip of a 6s lease: %v", l.Err())
		}
		time.Sleep(50 * time.Millisecond)
	}
	proxy.Heal()
	// Two renew periods after the blip: the deadline moved on, so heartbeats got through.
	time.Sleep(4 * time.Second)
	if got := token(t, l); got != tok {
		t.Fatalf("token %d after the blip, was %d", got, tok)
	}
	if l.TimeLeft() < 2*time.Second {
		t.Fatalf("no heartbeat accepted after the blip: %v left", l.TimeLeft())
	}
	release(t, l)
}

// I6: a holder cut off from the apiserver stops holding (Done, Token) at its local safe
// deadline, before the operator grants the lease to anyone else.
func TestI6ACutOffHolderLosesBeforeAnyoneElseIsGranted(t *testing.T) {
	e := setup(t, "go-cutoff", "db", 3)
	ctx := testenv.Ctx(t, 2*time.Minute)
	proxy, through := testenv.NewProxy(t, e.cfg)
	l, err := lease.Acquire(ctx, newClient(t, through), e.ns, "db", lease.Options{Identity: "cut-off", Wait: wait})
	if err != nil {
		t.Fatal(err)
	}
	tok := token(t, l)
	proxy.Cut()
	type granted struct {
		l  *lease.Lease
		at time.Time
	}
	next := make(chan granted, 1)
	go func() {
		n, err := lease.Acquire(ctx, e.c, e.ns, "db", lease.Options{Identity: "next", Wait: wait})
		if err != nil {
			t.Errorf("next acquires: %v", err)
		}
		next <- granted{n, time.Now()}
	}()
	select {
	case <-l.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done was not closed")
	}
	lostAt := time.Now()
	var lost *lease.LostError
	if !errors.As(l.Err(), &lost) || lost.Reason != lease.DeadlinePassed {
		t.Fatalf("lost: %v, want the deadline", l.Err())
	}
	g := <-next
	if g.l == nil {
		t.FailNow()
	}
	t.Logf("MEASURED cut-off holder stopped %v before the next holder was granted", g.at.Sub(lostAt))
	if !lostAt.Before(g.at) || token(t, g.l) <= tok {
		t.Fatalf("lost at %v, next granted at %v with token %d (was %d)", lostAt, g.at, token(t, g.l), tok)
	}
	release(t, g.l)
	proxy.Heal()
	// The claim's deletion was tried while cut off (the operator expires it instead):
	// Release only reports that.
	call, cancel := testenv.Call()
	defer cancel()
	if err := l.Release(call); err != nil && !errors.Is(err, lease.ErrUnavailable) {
		t.Fatalf("release: %v", err)
	}
	testenv.NoGoroutinesOf(t, libPath, 5*time.Second)
}

// TestPausedHolderChild is the paused holder of the next test: this test binary run again,
// acquiring and then printing every 20 ms whether it holds and how long since it looked.
func TestPausedHolderChild(t *testing.T) {
	ns := os.Getenv("FL_CHILD_NAMESPACE")
	if ns == "" {
		t.Skip("run by TestI6APausedHolderNeverReportsHoldingAfterItsDeadline")
	}
	cfg := testenv.Config(t)
	l, err := lease.Acquire(context.Background(), newClient(t, cfg), ns, "db", lease.Options{Identity: "paused", Wait: wait})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println("HOLDING", token(t, l))
	last := time.Now()
	for {
		select {
		case <-l.Done():
			fmt.Println("LOST", l.Err())
			return
		case <-time.After(20 * time.Millisecond):
		}
		gap := time.Since(last).Milliseconds()
		last = time.Now()
		if tok, err := l.Token(); err == nil {
			fmt.Println("TICK", gap, "held", tok)
		} else {
			fmt.Println("TICK", gap, "not-held")
		}
	}
}

type line struct {
	text string
	at   time.Time
}

// I6: a holder paused (SIGSTOP) past its lease never reports holding once resumed, and its
// Done is closed within a second of SIGCONT.
func TestI6APausedHolderNeverReportsHoldingAfterItsDeadline(t *testing.T) {
	e := setup(t, "go-sigstop", "db", 2)
	ctx := testenv.Ctx(t, 2*time.Minute)
	child := exec.Command(os.Args[0], "-test.run=^TestPausedHolderChild$", "-test.v")
	child.Env = append(os.Environ(), "FL_CHILD_NAMESPACE="+e.ns)
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = child.Process.Kill(); _ = child.Wait() }()
	lines := make(chan line, 10000)
	go func() {
		s := bufio.NewScanner(out)
		for s.Scan() {
			lines <- line{s.Text(), time.Now()}
		}
		close(lines)
	}()
	tok := waitForPrefix(t, lines, "HOLDING ", wait)
	testenv.Pause(t, child.Process)
	stoppedAt := time.Now()
	next := e.acquire(t, ctx, "db", "next")
	t.Logf("MEASURED paused holder replaced after %v (lease 2s)", time.Since(stoppedAt))
	if token(t, next) <= tok {
		t.Fatal("the next token is not greater")
	}
	for len(lines) > 0 {
		<-lines
	}
	resumedAt := time.Now()
	testenv.Resume(t, child.Process)
	lostAfter := watchResume(t, lines, resumedAt)
	t.Logf("MEASURED resumed holder's Done closed %v after SIGCONT", lostAfter)
	if lostAfter > time.Second {
		t.Errorf("Done closed %v after resume", lostAfter)
	}
	release(t, next)
}

// watchResume reads the resumed child's lines until LOST: none may say held after the pause.
func watchResume(t *testing.T, lines <-chan line, resumedAt time.Time) time.Duration {
	t.Helper()
	sawResume := false
	timeout := time.After(10 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("the child ended without LOST")
			}
			f := strings.Fields(l.text)
			if len(f) >= 3 && f[0] == "TICK" {
				gap, _ := strconv.Atoi(f[1])
				sawResume = sawResume || gap >= 1000
				if sawResume && f[2] == "held" {
					t.Fatalf("the resumed holder reported holding: %s", l.text)
				}
			}
			if len(f) > 0 && f[0] == "LOST" {
				return l.at.Sub(resumedAt)
			}
		case <-timeout:
			t.Fatal("no LOST within 10s of resume")
		}
	}
}

func waitForPrefix(t *testing.T, lines <-chan line, prefix string, limit time.Duration) int64 {
	t.Helper()
	timeout := time.After(limit)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("the child ended")
			}
			if v, found := strings.CutPrefix(l.text, prefix); found {
				n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
		case <-timeout:
			t.Fatalf("no %q within %v", prefix, limit)
		}
	}
}
