package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// FencedLease is a lease with a fencing token: at most one holder at a time, and every grant
// carries a token larger than all earlier ones. Users write its spec; only the operator
// writes its status.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
type FencedLease struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   FencedLeaseSpec    `json:"spec"`
	Status *FencedLeaseStatus `json:"status,omitempty"`
}

// FencedLeaseSpec is the desired behaviour of a fenced lease.
type FencedLeaseSpec struct {
	// LeaseDurationSeconds a holder keeps the lease after the operator last saw its heartbeat
	// change (1..3600; the apiserver defaults 0 to 15).
	LeaseDurationSeconds int32 `json:"leaseDurationSeconds,omitempty"`
	// MinToken is a floor for the next token: it is greater than both the last token and
	// this value. Raise it after restoring the protected resource from a backup.
	MinToken int64 `json:"minToken,omitempty"`
	// AnnotateHolderPod annotates the holder's pod with token.fencing.dev/<lease>: <token>
	// (nil: true).
	AnnotateHolderPod *bool `json:"annotateHolderPod,omitempty"`
	// FenceObjects has the apiserver refuse writes to objects labelled
	// fencing.dev/lease=<this lease> whose fencing.dev/token is below the lease's token.
	FenceObjects bool `json:"fenceObjects,omitempty"`
	// OnlyHolderWrites refuses writers that are not pods too (people, CI, ServiceAccount
	// tokens bound to no pod), for what the lease fences: only the holder's pod, identities a
	// Role rule naming the verb override on this lease allows, and the control plane write.
	OnlyHolderWrites bool `json:"onlyHolderWrites,omitempty"`
	// Fence names kinds of objects in the lease's namespace that only the lease's holder pod
	// may write, without labelling or stamping them.
	Fence *FenceSpec `json:"fence,omitempty"`
	// Follow names a coordination.k8s.io/v1 Lease of this namespace (a controller's leader
	// election) whose holder is this lease's holder; claims are not granted then, and each
	// change of the Lease's holder issues a new token.
	Follow *FollowSpec `json:"follow,omitempty"`
}

// FollowSpec names the coordination Lease a FencedLease follows (spec.follow).
type FollowSpec struct {
	// Lease is the Lease's name, in the FencedLease's namespace. Its holderIdentity names the
	// holder: the pod of that name, or of the part before the first "_".
	Lease string `json:"lease"`
}

// FenceSpec names the objects a lease fences by kind (spec.fence).
type FenceSpec struct {
	// Resources are the kinds fenced, every subresource included (1..32).
	Resources []FencedResource `json:"resources"`
	// Selector limits the fence to the objects whose labels match (all when nil).
	Selector *metav1.LabelSelector `json:"selector,omitempty"`
}

// FencedResource is a kind of object, named as in RBAC rules.
type FencedResource struct {
	// Group is the API group: "" (the core group), "apps", "batch", ...
	Group string `json:"group,omitempty"`
	// Resource is plural and lower case: "deployments", "configmaps", "jobs".
	Resource string `json:"resource"`
}

// FencedLeaseStatus is the observed state, written only by the operator: the source of
// truth for who holds the lease.
type FencedLeaseStatus struct {
	// Holder is the claim that holds the lease now, if any.
	Holder *LeaseHolder `json:"holder,omitempty"`
	// FencingToken is the last token issued (0 before the first grant). Never goes down.
	FencingToken int64 `json:"fencingToken,omitempty"`
	// AcquireTime is when the current holder was granted the lease.
	AcquireTime *metav1.MicroTime `json:"acquireTime,omitempty"`
	// LeaseDurationSeconds is the running term's duration, fixed when it was granted.
	LeaseDurationSeconds *int32 `json:"leaseDurationSeconds,omitempty"`
	// LeaseTransitions counts how many times the lease changed hands.
	LeaseTransitions int64 `json:"leaseTransitions,omitempty"`
	// Waiting counts the claims waiting for the lease.
	Waiting int32 `json:"waiting,omitempty"`
	// Conditions are the standard conditions (Held, Degraded).
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// ObservedGeneration is the spec generation this status reflects.
	ObservedGeneration *int64 `json:"observedGeneration,omitempty"`
}

// LeaseHolder says who holds a lease.
type LeaseHolder struct {
	// Claim is the name of the holding FencedLeaseClaim, in the lease's namespace (empty for
	// the holder of a followed Lease).
	Claim string `json:"claim,omitempty"`
	// ClaimUID is the UID of that claim: a new claim of the same name is another candidate.
	ClaimUID string `json:"claimUid,omitempty"`
	// Identity is the claim's holderIdentity.
	Identity string `json:"identity,omitempty"`
	// PodName is the claim's podName, if it names a pod.
	PodName *string `json:"podName,omitempty"`
	// PodUID is the UID of that pod when it was granted.
	PodUID *string `json:"podUid,omitempty"`
	// Lease is, for a lease that follows a coordination Lease, the term of that Lease this
	// holder was taken from.
	Lease *FollowedTerm `json:"lease,omitempty"`
}

// FollowedTerm is a term of a followed coordination Lease: another object, count of
// transitions, holder identity or pod is another term, with a new token.
type FollowedTerm struct {
	// Name is the Lease's name.
	Name string `json:"name,omitempty"`
	// UID is the Lease's UID.
	UID string `json:"uid,omitempty"`
	// LeaseTransitions is the Lease's spec.leaseTransitions.
	LeaseTransitions int64 `json:"leaseTransitions,omitempty"`
}

// FencedLeaseList is a list of FencedLeases.
//
// +kubebuilder:object:root=true
type FencedLeaseList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []FencedLease `json:"items"`
}
