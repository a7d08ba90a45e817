package fence_test

import (
	"errors"
	"testing"

	"github.com/fenced-lease/fenced-lease/go/fence"
	"github.com/fenced-lease/fenced-lease/go/internal/testenv"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// fixed is a token source that always gives the same token, or err.
type fixed struct {
	token int64
	err   error
}

func (f fixed) Token() (int64, error) { return f.token, f.err }

func configMap(ns, name string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: map[string]string{"v": "0"}}
}

func wantFenced(t *testing.T, err error, presented, highest int64) {
	t.Helper()
	var f *fence.Fenced
	if !errors.As(err, &f) || !errors.Is(err, fence.ErrFenced) || f.Presented != presented || f.Highest != highest {
		t.Fatalf("err = %v, want Fenced{%d, %d}", err, presented, highest)
	}
}

// The apiserver refuses a write whose stamp is lower than the object's, with both tokens,
// and accepts an equal or higher one; Delete stamps before it deletes.
func TestTheApiserverRefusesALowerStampAndDeleteStampsFirst(t *testing.T) {
	cfg := testenv.Config(t)
	c := testenv.Client(t, cfg)
	ns := testenv.Namespace(t, c, "go-fence-kube")
	ctx := testenv.Ctx(t, testenv.APITimeout)
	cm := configMap(ns, "payout")
	fence.Stamp(cm, "db", 7)
	if err := c.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	stale := cm.DeepCopy()
	fence.Stamp(stale, "db", 6)
	stale.Data["v"] = "stale"
	wantFenced(t, fence.FromAPIError(c.Update(ctx, stale)), 6, 7)
	again := cm.DeepCopy()
	again.Data["v"] = "again"
	if err := c.Update(ctx, again); err != nil {
		t.Fatalf("an equal token: %v", err)
	}
	if tok, ok := fence.TokenOf(again); !ok || tok != 7 {
		t.Fatalf("stored token %d %v", tok, ok)
	}
	wantFenced(t, fence.Delete(ctx, c, configMap(ns, "payout"), "db", 5), 5, 7)
	if err := fence.Delete(ctx, c, configMap(ns, "payout"), "db", 8); err != nil {
		t.Fatalf("delete with a higher token: %v", err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(cm), &corev1.ConfigMap{}); !apierrors.IsNotFound(err) {
		t.Fatalf("after delete: %v", err)
	}
}

// The stamping client stamps every kind of write with the current token; a client whose
// token is stale is refused by the apiserver, and one whose lease is lost does not send.
func TestTheStampingClientStampsEveryWrite(t *testing.T) {
	cfg := testenv.Config(t)
	c := testenv.Client(t, cfg)
	ns := testenv.Namespace(t, c, "go-fence-client")
	ctx := testenv.Ctx(t, testenv.APITimeout)
	fresh := fence.NewClient(c, "db", fixed{token: 9})
	cm := configMap(ns, "state")
	if err := fresh.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	before := cm.DeepCopy()
	cm.Data["v"] = "1"
	if err := fresh.Patch(ctx, cm, client.MergeFrom(before)); err != nil {
		t.Fatalf("merge patch: %v", err)
	}
	raw := client.RawPatch("application/merge-patch+json", []byte(`{"data":{"v":"2"}}`))
	if err := fresh.Patch(ctx, cm, raw); err != nil {
		t.Fatalf("raw merge patch: %v", err)
	}
	apply := corev1ac.ConfigMap("applied", ns).WithData(map[string]string{"v": "a"})
	if err := fresh.Apply(ctx, apply, client.FieldOwner("test")); err != nil {
		t.Fatalf("apply: %v", err)
	}
	applied := &corev1.ConfigMap{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "applied"}, applied); err != nil {
		t.Fatal(err)
	}
	for _, o := range []client.Object{cm, applied} {
		if tok, ok := fence.TokenOf(o); !ok || tok != 9 {
			t.Fatalf("%s carries token %d %v, want 9", o.GetName(), tok, ok)
		}
	}

	stale := fence.NewClient(c, "db", fixed{token: 8})
	cm.Data["v"] = "stale"
	wantFenced(t, stale.Update(ctx, cm), 8, 9)
	wantFenced(t, stale.Patch(ctx, cm, raw), 8, 9)
	wantFenced(t, stale.Delete(ctx, configMap(ns, "state")), 8, 9)
	jsonPatch := client.RawPatch("application/json-patch+json", []byte(`[]`))
	if err := fresh.Patch(ctx, cm, jsonPatch); !errors.Is(err, fence.ErrUnstampable) {
		t.Fatalf("a JSON patch: %v, want ErrUnstampable", err)
	}

	lost := errors.New("lease lost")
	gone := fence.NewClient(c, "db", fixed{err: lost})
	if err := gone.Create(ctx, configMap(ns, "never")); !errors.Is(err, lost) {
		t.Fatalf("a lost lease: %v", err)
	}
	if err := gone.Status().Update(ctx, cm); !errors.Is(err, lost) {
		t.Fatalf("a lost lease's status write: %v", err)
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "never"}, &corev1.ConfigMap{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a write of a lost lease was sent: %v", err)
	}
	if err := fresh.Delete(ctx, configMap(ns, "state")); err != nil {
		t.Fatalf("delete: %v", err)
	}
}

func TestFencingRefusalsAreTyped(t *testing.T) {
	gr := schema.GroupResource{Resource: "configmaps"}
	forbidden := func(msg string) error { return apierrors.NewForbidden(gr, "c", errors.New(msg)) }
	wantFenced(t, fence.FromAPIError(forbidden("ValidatingAdmissionPolicy 'fenced-lease-object-token' denied request: fenced: ConfigMap ns/c: fencing.dev/token 6 is lower than 7, the token stored on the object (lease l)")), 6, 7)
	var nh *fence.NotHolder
	err := fence.FromAPIError(forbidden("denied request: fenced: ConfigMap ns/c: pod pa does not hold FencedLease ns/l (pod pb holds it)"))
	if !errors.As(err, &nh) || !errors.Is(err, fence.ErrFenced) {
		t.Fatalf("identity refusal: %v", err)
	}
	if err := fence.FromAPIError(forbidden("User cannot")); errors.Is(err, fence.ErrFenced) {
		t.Fatal("an RBAC refusal is not fencing")
	}
	if !fence.Accepts(7, 7) || fence.Accepts(8, 7) {
		t.Fatal("Accepts")
	}
}
