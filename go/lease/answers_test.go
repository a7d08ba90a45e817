package lease_test

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced-lease/fenced-lease/go/internal/testenv"
	"github.com/fenced-lease/fenced-lease/go/lease"
	"k8s.io/client-go/rest"
)

// lostAnswer forwards every request, but answers the first create of a claim with a transport
// error after the apiserver has carried it out, as a connection reset between the request and
// its answer does.
type lostAnswer struct {
	next    http.RoundTripper
	dropped *atomic.Int32
}

func (l *lostAnswer) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := l.next.RoundTrip(req)
	if err != nil || req.Method != http.MethodPost || !strings.HasSuffix(req.URL.Path, "/fencedleaseclaims") ||
		resp.StatusCode != http.StatusCreated || !l.dropped.CompareAndSwap(0, 1) {
		return resp, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return nil, errors.New("connection reset by peer (injected: the claim was created, its answer lost)")
}

// A create whose answer was lost may have created the claim: the holder tries again under the
// same name, and adopts the claim it finds (it keeps its place) instead of queueing a second
// one behind it, where it would wait for its own first claim to expire.
func TestAClaimWhoseCreateAnswerWasLostIsAdopted(t *testing.T) {
	e := setup(t, "go-lost-answer", "db", 15)
	ctx := testenv.Ctx(t, 2*time.Minute)
	var dropped atomic.Int32
	cfg := rest.CopyConfig(e.cfg)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return &lostAnswer{next: rt, dropped: &dropped}
	}
	asked := time.Now()
	l, err := lease.Acquire(ctx, newClient(t, cfg), e.ns, "db", lease.Options{Identity: "lost-answer", Wait: wait})
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(asked)
	if dropped.Load() != 1 {
		t.Fatal("no create's answer was dropped: the test did not test")
	}
	claims := e.claimsOf(t, "lost-answer")
	if len(claims) != 1 || claims[0].Name != l.Claim() {
		names := make([]string, len(claims))
		for i, c := range claims {
			names[i] = c.Name
		}
		t.Fatalf("holding with claim %s; the holder's claims: %v (want only the one the lost create made)", l.Claim(), names)
	}
	if took > 5*time.Second {
		t.Fatalf("granted after %v", took)
	}
	t.Logf("MEASURED acquire through a lost create answer: %v", took)
	release(t, l)
}
