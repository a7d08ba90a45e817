package lease

import (
	"crypto/rand"
	"time"

	"github.com/fenced-lease/fenced-lease/go/api/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// claimSuffixLen is the length of the random part of a claim name.
const claimSuffixLen = 10

// claimName is a fresh claim name, <lease>-<10 random characters>, chosen by the holder
// rather than by the apiserver (generateName): when a create times out, the holder can
// create again under the same name (409: it exists, adopt it) or delete it, instead of
// leaving a claim nobody heartbeats in the queue.
func claimName(lease string) string {
	const alphabet = "bcdfghjklmnpqrstvwxz2456789"
	b := make([]byte, claimSuffixLen)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return lease + "-" + string(b)
}

// newClaim is claim name on lease, with its first heartbeat. With a pod whose UID is known,
// the claim is owned by it, so the pod's deletion frees it.
func newClaim(ns, name, lease, identity string, pod *PodRef, now time.Time) *v1alpha1.FencedLeaseClaim {
	renew := metav1.NewMicroTime(now.UTC())
	c := &v1alpha1.FencedLeaseClaim{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: "FencedLeaseClaim"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.FencedLeaseClaimSpec{
			LeaseName:      lease,
			HolderIdentity: identity,
			RenewTime:      &renew,
		},
	}
	if pod != nil {
		podName := pod.Name
		c.Spec.PodName = &podName
		if pod.UID != "" {
			c.OwnerReferences = []metav1.OwnerReference{{
				APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: types.UID(pod.UID),
			}}
		}
	}
	return c
}
