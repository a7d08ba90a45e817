package lease_test

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/fenced-lease/fenced-lease/go/api/v1alpha1"
	"github.com/fenced-lease/fenced-lease/go/internal/testenv"
	"github.com/fenced-lease/fenced-lease/go/lease"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// A holder in a pod, as the downward API names it (POD_NAME, POD_UID, POD_NAMESPACE): its
// claim names the pod and is owned by it, and the operator annotates the pod with the token.
func TestAHolderInAPodOwnsItsClaimAndThePodCarriesTheToken(t *testing.T) {
	e := setup(t, "go-pod", "db", 15)
	ctx := testenv.Ctx(t, time.Minute)
	pod := &corev1.Pod{
		ObjectMeta: metaOf(e.ns, "worker-0"),
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "w", Image: "none"}}},
	}
	call, cancel := testenv.Call()
	defer cancel()
	if err := e.admin.Create(call, pod); err != nil {
		t.Fatal(err)
	}
	t.Setenv("POD_NAME", pod.Name)
	t.Setenv("POD_UID", string(pod.UID))
	t.Setenv("POD_NAMESPACE", e.ns)
	l, err := lease.Acquire(ctx, e.c, e.ns, "db", lease.Options{Identity: "worker-0", Wait: wait})
	if err != nil {
		t.Fatal(err)
	}
	claim := e.claimsOf(t, "worker-0")[0]
	owners := claim.OwnerReferences
	if claim.Spec.PodName == nil || *claim.Spec.PodName != pod.Name || len(owners) != 1 ||
		owners[0].Kind != "Pod" || owners[0].UID != pod.UID {
		t.Fatalf("claim podName %v, owners %+v", claim.Spec.PodName, owners)
	}
	want := strconv.FormatInt(token(t, l), 10)
	key := v1alpha1.TokenAnnotationKey("db")
	testenv.Eventually(t, "the pod's token annotation", 10*time.Second, func() error {
		got := &corev1.Pod{}
		call, cancel := testenv.Call()
		defer cancel()
		if err := e.admin.Get(call, client.ObjectKeyFromObject(pod), got); err != nil {
			return err
		}
		if got.Annotations[key] != want {
			return fmt.Errorf("%s = %q, want %q", key, got.Annotations[key], want)
		}
		return nil
	})
	release(t, l)
}
