package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/fenced-lease/fenced-lease/go/api/v1alpha1"
	"github.com/fenced-lease/fenced-lease/go/fence"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	eventsclient "k8s.io/client-go/kubernetes/typed/events/v1"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Refusal says what a guard's refusal of this holder's write means (Lease.Refusal).
type Refusal int

const (
	// NotRefused is an error that is no refusal for a stale token.
	NotRefused Refusal = iota
	// NewerHolder is a refusal because the lease moved on and a newer holder wrote: stop, do
	// not retry.
	NewerHolder
	// MarkAhead is a refusal by a mark above every token the lease has issued, though this
	// holder still holds it (a restored backup, a lease re-created with its token records
	// lost). Every write is refused until someone resets the mark deliberately.
	MarkAhead
)

func (r Refusal) String() string {
	switch r {
	case NewerHolder:
		return "NewerHolder"
	case MarkAhead:
		return "MarkAhead"
	default:
		return "NotRefused"
	}
}

// The Warning Event a refused holder sends on the FencedLease; the operator counts them per
// lease for the alert FencedLeaseWriteRefused. The same as the Rust library's.
const (
	WriteRefusedReason        = "WriteRefused"
	HolderReportingController = "fencing.dev/holder"
	// reportInterval: at most one Event call per lease per interval, after the first's.
	reportInterval = 10 * time.Second
	maxInstance    = 128
	maxNote        = 1024
)

// refusals counts this process's refused writes per lease (never per token or pod), in
// controller-runtime's registry: a controller's /metrics serves it.
var refusals = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "fenced_lease_holder_write_refusals_total",
	Help: "Writes of this program that a fence or guard refused for a stale token, by lease",
}, []string{"namespace", "lease"})

func init() { metrics.Registry.MustRegister(refusals) }

// Refusal says what err, an error of a guarded write, means: NotRefused for an error that is
// no refusal. While the lease is held nobody has a higher token, so a mark above this
// holder's token is a lost one's (MarkAhead); otherwise a newer holder wrote (NewerHolder).
//
// A refusal is also reported: an error log line with the lease and both tokens, a count in
// fenced_lease_holder_write_refusals_total, and a Warning Event WriteRefused on the
// FencedLease (the first at once, then at most one call per lease per 10 s), which the
// operator counts for its critical alert. Call it on every error of a guarded write;
// Reported waits until the Event is sent.
func (l *Lease) Refusal(err error) Refusal {
	var fenced *fence.Fenced
	var notHolder *fence.NotHolder
	isFenced := errors.As(err, &fenced)
	if !isFenced && !errors.As(err, &notHolder) {
		return NotRefused
	}
	granted := l.k.grantedToken()
	refusal := NewerHolder
	if token, tokenErr := l.Token(); tokenErr == nil && isFenced && fenced.Highest > token {
		refusal = MarkAhead
	}
	kv := []any{"refusal", refusal.String(), "error", err.Error()}
	if isFenced {
		kv = append(kv, "scope", fenced.Scope, "presented", fenced.Presented, "highest", fenced.Highest)
	}
	l.k.log.Error(err, "write refused: a stale token (a newer holder wrote, or the resource's mark is ahead)", kv...)
	refusals.WithLabelValues(l.k.namespace, l.k.lease).Inc()
	who := "claim " + l.k.claim
	if granted != 0 {
		who = fmt.Sprintf("claim %s (token %d)", l.k.claim, granted)
	}
	l.k.reports.record(who + ": " + err.Error())
	return refusal
}

// Reported waits until the refusals reported so far (Refusal) are sent to the apiserver as
// an Event, at most two request timeouts or until ctx is done: call it before the process
// exits. Release does.
func (l *Lease) Reported(ctx context.Context) { l.k.reports.wait(ctx) }

// grantedToken is the token this claim was granted, held or not (0 before a grant).
func (k *keeper) grantedToken() int64 {
	t, _ := k.snapshot()
	return t.state.Token
}

// reportingInstance names who reports this claim's refusals: its creator's pod as the
// apiserver authenticated it (the creator annotations, I7), else its username, else the
// holder identity. The refusal-reports policy admits a report under its sender's name only.
func reportingInstance(created *v1alpha1.FencedLeaseClaim, identity string) string {
	if created != nil {
		for _, key := range []string{"fencing.dev/created-by-pod", "fencing.dev/created-by"} {
			if v := created.Annotations[key]; v != "" {
				return v
			}
		}
	}
	return identity
}

// reporter sends one claim's refusals as a Warning Event, paced: the first at once, then at
// most one call per reportInterval into the same Event, whose series.count is the number of
// refusals and whose note is the last one's.
type reporter struct {
	events           eventsclient.EventInterface // nil: count and log only
	namespace, lease string
	instance         string
	callTimeout      time.Duration
	mu               sync.Mutex
	refused, sent    uint64
	note, name       string
	lastSent         time.Time // of the last call (zero: none yet)
	sending          bool
	flush            chan struct{} // cuts the pause before a call short
	sentChanged      chan struct{} // closed and replaced when sent changes
}

func newReporter(events eventsclient.EventsV1Interface, namespace, lease, instance string, callTimeout time.Duration) *reporter {
	r := &reporter{
		namespace: namespace, lease: lease, instance: truncate(instance, maxInstance),
		callTimeout: callTimeout, flush: make(chan struct{}, 1), sentChanged: make(chan struct{}),
	}
	if events != nil {
		r.events = events.Events(namespace)
	}
	return r
}

func (r *reporter) record(note string) {
	r.mu.Lock()
	r.refused++
	r.note = note
	start := !r.sending
	r.sending = true
	r.mu.Unlock()
	if start {
		go r.sendPaced()
	}
}

func (r *reporter) wait(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 2*r.callTimeout)
	defer cancel()
	r.mu.Lock()
	target := r.refused
	r.mu.Unlock()
	select {
	case r.flush <- struct{}{}:
	default:
	}
	for {
		r.mu.Lock()
		sent, changed := r.sent, r.sentChanged
		r.mu.Unlock()
		if sent >= target {
			return
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return
		}
	}
}

// sendPaced sends what was recorded, at most one call per reportInterval (a flush does not
// wait), and returns as soon as nothing is left to send: no goroutine outlives the reports.
func (r *reporter) sendPaced() {
	for {
		r.mu.Lock()
		if r.refused == r.sent {
			r.sending = false
			r.mu.Unlock()
			return
		}
		pause := time.Until(r.lastSent.Add(reportInterval))
		r.mu.Unlock()
		if pause > 0 {
			select {
			case <-time.After(pause):
			case <-r.flush:
			}
		}
		r.mu.Lock()
		refused, note, name := r.refused, r.note, r.name
		r.mu.Unlock()
		name = r.send(refused, note, name)
		r.mu.Lock()
		r.name, r.sent, r.lastSent = name, refused, time.Now()
		close(r.sentChanged)
		r.sentChanged = make(chan struct{})
		r.mu.Unlock()
	}
}

// send makes one call: a new Event, or the series of the existing one (created again if it
// has expired). A failure is logged and not retried: the next refusal tries again.
func (r *reporter) send(refused uint64, note, name string) string {
	if r.events == nil {
		return name
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.callTimeout)
	defer cancel()
	now := metav1.NowMicro()
	count := int32(min(refused, 1<<31-1))
	if name != "" {
		patch := fmt.Sprintf(`{"note":%q,"series":{"count":%d,"lastObservedTime":%q}}`,
			truncate(note, maxNote), count, now.Format(metav1.RFC3339Micro))
		_, err := r.events.Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		if err == nil {
			return name
		}
		if !apierrors.IsNotFound(err) {
			r.failed(err)
			return name
		}
	}
	event := &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{
			Name:      fmt.Sprintf("%s.%x", r.lease, time.Now().UnixNano()),
			Namespace: r.namespace,
		},
		EventTime: now, Type: corev1.EventTypeWarning, Reason: WriteRefusedReason, Action: "Write",
		Note: truncate(note, maxNote),
		Regarding: corev1.ObjectReference{
			APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: "FencedLease",
			Namespace: r.namespace, Name: r.lease,
		},
		ReportingController: HolderReportingController, ReportingInstance: r.instance,
	}
	if refused > 1 {
		event.Series = &eventsv1.EventSeries{Count: count, LastObservedTime: now}
	}
	created, err := r.events.Create(ctx, event, metav1.CreateOptions{})
	if err != nil {
		r.failed(err)
		return ""
	}
	return created.Name
}

func (r *reporter) failed(err error) {
	Logger(context.Background()).Info("could not report the refusal as an Event (needs create and patch on events.k8s.io events: the holder role)",
		"lease", r.namespace+"/"+r.lease, "error", err.Error())
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
