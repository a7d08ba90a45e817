// Command jepsenholder is the Go library's holder process in the repository's safety suite
// (tests/safety/jepsen): the suite's runner starts it as a pod of its own beside the Rust
// library's holders and kubectl fence's, with the same environment (JEPSEN_*, KUBECONFIG,
// FL_POSTGRES_URL, FL_REDIS_URL, POD_*), and checks what it records with the same checker.
//
// Again and again until the run stops (its STOP file exists, or SIGTERM): it acquires its
// lease, asks Token before every write and every few milliseconds besides, writes the token
// through package fence's guards to the run's ConfigMap, its PostgreSQL row and its Redis
// key, and lets go (Release, cancelling the context given to Acquire, or Release and then,
// as a stale process would, writing the old token once the lease has moved on: only the
// fences stop those writes). Every step is one JSON line of the process's history file, in
// the format of the suite's history.rs.
//
// It holds its lease in one of two ways (-mode):
//   - lease (the default): package lease, lease.Acquire and the Lease it returns;
//   - lock: package lock, as controller-runtime's manager uses it: client-go's
//     leaderelection elector on a lock.Lock, the token from the Lock (its TokenSource), one
//     Lock for the process and a new elector for each term; see lockmode.go;
//   - follow (with -follow=NAME): client-go's elector on coordination Lease NAME, which the
//     run's FencedLease follows; no fenced-lease code decides when it writes; see
//     followmode.go.
package main

import (
	"context"
	"flag"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/fenced-lease/fenced-lease/go/lease"
	"k8s.io/client-go/tools/clientcmd"
)

const (
	// probeEvery: how often Token is asked while the lease is held...
	probeEvery = 5 * time.Millisecond
	// ...and an Ok answer is recorded at most this often (every Err, and the last Ok before
	// it, always).
	probeRecordEvery = 50 * time.Millisecond
	// zombiePoll: how often a stale process reads its lease until it has moved on.
	zombiePoll = 25 * time.Millisecond
)

// settings is what the runner tells a holder process through its environment.
type settings struct {
	process, namespace, lease, kubeconfig, runDir string
	postgres, redis                               string
	term                                          time.Duration
	seed                                          uint64
}

func fromEnv() (settings, error) {
	var missing []string
	get := func(name string) string {
		v := os.Getenv(name)
		if v == "" {
			missing = append(missing, name)
		}
		return v
	}
	s := settings{
		process: get("JEPSEN_PROCESS"), namespace: get("JEPSEN_NAMESPACE"), lease: get("JEPSEN_LEASE"),
		kubeconfig: get("KUBECONFIG"), runDir: get("JEPSEN_RUN_DIR"),
		postgres: get("FL_POSTGRES_URL"), redis: get("FL_REDIS_URL"),
	}
	term, seed := get("JEPSEN_TERM"), get("JEPSEN_SEED")
	if len(missing) > 0 {
		return s, fmt.Errorf("not set: %v", missing)
	}
	seconds, err := strconv.ParseUint(term, 10, 32)
	if err != nil {
		return s, fmt.Errorf("JEPSEN_TERM: %w", err)
	}
	s.term = time.Duration(seconds) * time.Second
	if s.seed, err = strconv.ParseUint(seed, 10, 64); err != nil {
		return s, fmt.Errorf("JEPSEN_SEED: %w", err)
	}
	return s, nil
}

// rng is the process's own random sequence, from the run's seed and its name.
func (s settings) rng() *rand.Rand {
	h := fnv.New64a()
	_, _ = h.Write([]byte(s.process))
	return rand.New(rand.NewPCG(s.seed, h.Sum64()))
}

func main() {
	mode := flag.String("mode", "lease", "how the lease is held: lease (package lease), lock (package lock, with client-go's elector) or follow (client-go's elector on the Lease the FencedLease follows)")
	followed := flag.String("follow", "", "with -mode=follow: the coordination Lease to elect on, which the FencedLease JEPSEN_LEASE follows")
	flag.Parse()
	s, err := fromEnv()
	switch {
	case err != nil:
	case *mode != "lease" && *mode != "lock" && *mode != "follow":
		err = fmt.Errorf("-mode %q: lease, lock or follow", *mode)
	case (*mode == "follow") != (*followed != ""):
		err = fmt.Errorf("-follow names the Lease of -mode=follow, and only of it")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "jepsenholder:", err)
		os.Exit(2)
	}
	if err := run(s, *mode, *followed); err != nil {
		fmt.Fprintln(os.Stderr, "jepsenholder:", err)
		os.Exit(1)
	}
}

func run(s settings, mode, followed string) error {
	rec, err := newRecorder(filepath.Join(s.runDir, s.process+".jsonl"), s.process)
	if err != nil {
		return err
	}
	config, err := clientcmd.BuildConfigFromFlags("", s.kubeconfig)
	if err != nil {
		return err
	}
	config.QPS, config.Burst = 100, 100
	res, err := newResources(s, config)
	if err != nil {
		return err
	}
	defer res.close()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() { // the run is over when its STOP file exists
		for ctx.Err() == nil {
			if _, err := os.Stat(filepath.Join(s.runDir, "STOP")); err == nil {
				stop()
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	h := &holder{s: s, rec: rec, res: res, rng: s.rng(), rounds: rounds}
	switch mode {
	case "lock":
		return h.runLock(ctx, config)
	case "follow":
		h.rounds = followRounds
		return h.runFollow(ctx, config, followed)
	}
	c, err := lease.NewClient(config)
	if err != nil {
		return err
	}
	for ctx.Err() == nil {
		h.round(ctx, c)
	}
	return nil
}

// holder is one process's state across its rounds.
type holder struct {
	s   settings
	rec *recorder
	res *resources
	rng *rand.Rand
	// rounds: the resources a zombie writes its old token to.
	rounds []resource
}

// tokens is what a holder asks before it writes: a Lease, or a Lock.
type tokens interface {
	Token() (int64, error)
}

// held is a term as the holder's events name it: the token source and the claim.
type held struct {
	tokens tokens
	claim  string
}

func (h *holder) between(lo, hi int) time.Duration {
	return time.Duration(lo+h.rng.IntN(hi-lo)) * time.Millisecond
}

// hold is how long a round writes: 0.3 to 2 terms.
func (h *holder) hold() time.Duration {
	return h.s.term * time.Duration(300+h.rng.IntN(1700)) / 1000
}

// round acquires the lease with package lease, writes while it holds, and lets go.
func (h *holder) round(ctx context.Context, c *lease.Client) {
	name := h.s.lease
	h.rec.record(event{"ev": "waiting", "lease": name})
	holdCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	l, err := lease.Acquire(holdCtx, c, h.s.namespace, name, lease.Options{Identity: h.s.process, Wait: time.Minute})
	if err != nil {
		if ctx.Err() == nil {
			h.rec.record(event{"ev": "acquire-failed", "lease": name, "error": err.Error()})
			sleep(ctx, h.between(200, 1000))
		}
		return
	}
	token, _ := l.Token()
	h.rec.record(event{"ev": "acquired", "lease": name, "claim": l.Claim(), "token": token})
	watch := h.watchLoss(l)
	term := held{tokens: l, claim: l.Claim()}
	probe := h.probe(ctx, term)
	lost := h.write(ctx, term, h.hold())
	probe()
	watch()

	how := "released"
	switch choice := h.rng.IntN(8); {
	case choice == 0:
		cancel() // the library releases when Acquire's context ends
		<-l.Context().Done()
		how = "cancelled"
	case choice <= 2 && !lost:
		h.stale(ctx, l, token)
		return
	default:
		release, done := context.WithTimeout(context.Background(), 10*time.Second)
		_ = l.Release(release)
		done()
	}
	if lost { // letting go of a lease already lost hands nothing over
		how = "after-loss"
	}
	h.rec.record(event{"ev": "released", "lease": name, "claim": l.Claim(), "how": how})
	sleep(ctx, h.between(0, 400))
}

// write writes the token round after round for hold, asking Token before each write; it
// stops early when a fence refuses (a newer holder exists) or ctx ends. Reports whether the
// lease was lost meanwhile (Token failed).
func (h *holder) write(ctx context.Context, term held, hold time.Duration) bool {
	until := time.Now().Add(hold)
	turn := h.rng.IntN(len(rounds))
	for time.Now().Before(until) && ctx.Err() == nil {
		token, ok := h.ask(term)
		if !ok {
			return true
		}
		turn = (turn + 1) % len(rounds)
		if h.res.write(h.rec, rounds[turn], h.s.lease, token) {
			return false
		}
		sleep(ctx, h.between(5, 60))
	}
	return false
}

// ask is one Token call, recorded with its call and return instants.
func (h *holder) ask(term held) (int64, bool) {
	called := monotonic()
	token, err := term.tokens.Token()
	t := monotonic()
	if err != nil {
		h.rec.recordAt(t, event{"ev": "token-err", "lease": h.s.lease, "claim": term.claim, "called": called, "reason": err.Error()})
		return 0, false
	}
	h.rec.recordAt(t, event{"ev": "token-ok", "lease": h.s.lease, "claim": term.claim, "token": token, "called": called})
	return token, true
}

// watchLoss records the loss of l if it comes before the returned function is called
// (which waits for the watcher to stop).
func (h *holder) watchLoss(l *lease.Lease) func() {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		select {
		case <-done:
			return
		case <-l.Done():
		}
		reason := lease.NotGranted
		if lost, ok := l.Err().(*lease.LostError); ok {
			reason = lost.Reason
		}
		h.rec.record(event{
			"ev": "lost", "lease": l.Name(), "claim": l.Claim(), "reason": reason.String(),
			"by_operator": reason == lease.Expired || reason == lease.Superseded,
			"deadline_in": l.DeadlineIn().Nanoseconds(),
		})
	})
	return func() { close(done); wg.Wait() }
}

// probe asks Token every probeEvery while the lease is held, recording an Ok answer at most
// every probeRecordEvery, and always the last Ok before the first Err, until ctx ends. The
// returned function stops it.
func (h *holder) probe(ctx context.Context, term held) func() {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		var recorded uint64
		var pending event
		var pendingAt uint64
		flush := func() {
			if pending != nil {
				h.rec.recordAt(pendingAt, pending)
				pending = nil
			}
		}
		ticker := time.NewTicker(probeEvery)
		defer ticker.Stop()
		for {
			called := monotonic()
			token, err := term.tokens.Token()
			t := monotonic()
			if err != nil {
				flush()
				h.rec.recordAt(t, event{"ev": "token-err", "lease": h.s.lease, "claim": term.claim, "called": called, "reason": err.Error()})
				return
			}
			pending, pendingAt = event{"ev": "token-ok", "lease": h.s.lease, "claim": term.claim, "token": token, "called": called}, t
			if t-recorded >= uint64(probeRecordEvery) {
				flush()
				recorded = t
			}
			select {
			case <-done:
				flush()
				return
			case <-ctx.Done():
				flush()
				return
			case <-ticker.C:
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// stale releases the lease, then behaves as a process that woke from a pause and never asked
// Token again (zombie).
func (h *holder) stale(ctx context.Context, l *lease.Lease, token int64) {
	release, done := context.WithTimeout(context.Background(), 10*time.Second)
	_ = l.Release(release)
	done()
	h.rec.record(event{"ev": "released", "lease": h.s.lease, "claim": l.Claim(), "how": "released"})
	h.zombie(ctx, token)
}

// zombie is a holder that let go of token's term and never asks Token again: once the lease
// has moved on (read from the store) and its new holder had time to write, it writes its old
// token to every resource. Only the fences stop it.
func (h *holder) zombie(ctx context.Context, token int64) {
	giveUp := time.Now().Add(3 * h.s.term)
	for ctx.Err() == nil && time.Now().Before(giveUp) {
		if state, ok := h.res.leaseMovedOn(ctx, h.s.lease, token); ok {
			h.rec.record(state)
			sleep(ctx, h.between(100, 600))
			for _, r := range h.rounds {
				h.res.write(h.rec, r, h.s.lease, token)
			}
			return
		}
		sleep(ctx, zombiePoll)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
