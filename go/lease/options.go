package lease

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/fenced-lease/fenced-lease/go/internal/backoff"
)

// Wait values with a meaning of their own (any positive Options.Wait is a time limit).
const (
	// WaitForever waits for the grant until the context is done.
	WaitForever time.Duration = 0
	// NoWait takes the lease only if it is free: one try, ErrTimeout at once when it is
	// held or others wait.
	NoWait time.Duration = -1
)

// Options of Acquire. The zero value waits forever as DefaultIdentity, from the pod the
// downward API names.
type Options struct {
	// Identity says who is asking. Default: DefaultIdentity (unique per process).
	Identity string
	// Pod is the holder's pod: annotated with the token, and owner of the claim (so its
	// deletion frees the lease) when its UID is known. Default: PodFromEnv.
	Pod *PodRef
	// Wait bounds the wait for the grant: WaitForever (the zero value) waits until the
	// context is done, NoWait tries once, a positive duration gives up after it. Transient
	// API errors are retried meanwhile. It never gives up before the operator has answered
	// the claim once (or one request timeout has passed).
	Wait time.Duration
	// Margin is taken off the lease duration for the local safe deadline; it must be shorter
	// than the duration. Default: DefaultMargin of the duration.
	Margin time.Duration
	// RequestTimeout bounds one API request. Default: a third of the lease duration, between
	// 250 ms and 10 s. A heartbeat never waits past the local safe deadline whatever this says.
	RequestTimeout time.Duration
}

// ServiceAccountNamespaceFile says which namespace a pod runs in.
const ServiceAccountNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// PodRef names the holder's own pod.
type PodRef struct {
	// Name of the pod, in the lease's namespace.
	Name string
	// UID of the pod, for the claim's ownerReference; empty if unknown.
	UID string
}

// PodFromEnv reads the downward-API variables POD_NAME, POD_UID and POD_NAMESPACE, as
// kubectl fence does (without POD_NAMESPACE, the namespace comes from the ServiceAccount
// mount). Nil outside a pod, or when the pod runs in another namespace than the lease (an
// ownerReference cannot cross namespaces).
func PodFromEnv(leaseNamespace string) *PodRef {
	return podFrom(leaseNamespace, os.Getenv, func() string {
		b, _ := os.ReadFile(ServiceAccountNamespaceFile)
		return string(b)
	})
}

func podFrom(leaseNamespace string, env func(string) string, saNamespace func() string) *PodRef {
	name := env("POD_NAME")
	if name == "" {
		return nil
	}
	ns := env("POD_NAMESPACE")
	if ns == "" {
		ns = strings.TrimSpace(saNamespace())
	}
	if ns != "" && ns != leaseNamespace {
		return nil
	}
	return &PodRef{Name: name, UID: env("POD_UID")}
}

// maxIdentityLen is the longest holder identity the claim schema accepts.
const maxIdentityLen = 253

var defaultIdentity = sync.OnceValue(func() string {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:])
	return identityFrom(os.Getenv("POD_NAME"), host, binary.BigEndian.Uint32(b[:]))
})

// DefaultIdentity is unique per process: POD_NAME, else the hostname, else "holder",
// followed by a random suffix chosen once per process, e.g. web-0-3f9a1c2e. Candidates must
// never share an identity: leadership is reported by identity.
func DefaultIdentity() string { return defaultIdentity() }

func identityFrom(podName, hostname string, suffix uint32) string {
	base := podName
	if base == "" {
		base = hostname
	}
	if base == "" {
		base = "holder"
	}
	tail := fmt.Sprintf("-%08x", suffix)
	if keep := maxIdentityLen - len(tail); len(base) > keep {
		cut := keep
		for cut > 0 && !utf8Start(base[cut]) {
			cut--
		}
		base = base[:cut]
	}
	return base + tail
}

func utf8Start(b byte) bool { return b&0xC0 != 0x80 }

// timing is the heartbeat pacing for one lease duration.
type timing struct {
	duration    time.Duration
	margin      time.Duration
	renewEvery  time.Duration
	callTimeout time.Duration
}

// DefaultMargin is a tenth of the duration, between 100 ms and 2 s.
func DefaultMargin(duration time.Duration) time.Duration {
	return min(max(duration/10, 100*time.Millisecond), 2*time.Second)
}

func newTiming(duration, margin, callTimeout time.Duration) timing {
	if margin <= 0 {
		margin = DefaultMargin(duration)
	}
	renew := max(duration/3, 50*time.Millisecond)
	t := timing{
		duration:    duration,
		margin:      min(margin, duration),
		renewEvery:  renew,
		callTimeout: min(max(renew, 250*time.Millisecond), 10*time.Second),
	}
	if callTimeout > 0 {
		t.callTimeout = callTimeout
	}
	return t
}

// maxHeartbeatRetry bounds the pause between heartbeat retries on long leases: 100 ms
// doubled nine times.
const maxHeartbeatRetry = 51200 * time.Millisecond

// retryAfter is the pause before retry number attempt (1-based) of a failed heartbeat:
// exponential from 100 ms, at most a fifth of the renew period (at least 20 ms, at most
// maxHeartbeatRetry), with jitter in 0..1.
func (t timing) retryAfter(attempt int, jitter float64) time.Duration {
	limit := min(max(t.renewEvery/5, 20*time.Millisecond), maxHeartbeatRetry)
	return backoff.Backoff{Base: 100 * time.Millisecond, Cap: limit}.Pause(attempt, jitter)
}
