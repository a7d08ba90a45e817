package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// FencedLeaseClaim is a candidate's request for a FencedLease, bound to it like a PVC to a
// PV. The candidate writes the spec (and its heartbeat); only the operator writes the
// status. Deleting the claim releases the lease.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
type FencedLeaseClaim struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   FencedLeaseClaimSpec    `json:"spec"`
	Status *FencedLeaseClaimStatus `json:"status,omitempty"`
}

// FencedLeaseClaimSpec is what a candidate asks for.
type FencedLeaseClaimSpec struct {
	// LeaseName is the FencedLease (same namespace) this claim asks for. Immutable.
	LeaseName string `json:"leaseName"`
	// HolderIdentity says who is asking: stable and human-readable. Immutable.
	HolderIdentity string `json:"holderIdentity"`
	// PodName is the holder's pod, in the same namespace: annotated with the token while it
	// holds the lease; its deletion releases the lease. Immutable.
	PodName *string `json:"podName,omitempty"`
	// RenewTime is the heartbeat, updated every leaseDurationSeconds/3 or so.
	RenewTime *metav1.MicroTime `json:"renewTime,omitempty"`
}

// ClaimPhase says where a claim stands.
type ClaimPhase string

const (
	// ClaimPending is waiting in the queue.
	ClaimPending ClaimPhase = "Pending"
	// ClaimGranted holds the lease with status.fencingToken.
	ClaimGranted ClaimPhase = "Granted"
	// ClaimExpired held the lease, but its heartbeat stopped for longer than the duration.
	ClaimExpired ClaimPhase = "Expired"
	// ClaimRevoked held the lease, but it was taken away (its pod was deleted, say).
	ClaimRevoked ClaimPhase = "Revoked"
)

// ClaimPhases lists every phase, in the order of a claim's life.
var ClaimPhases = []ClaimPhase{ClaimPending, ClaimGranted, ClaimExpired, ClaimRevoked}

// FencedLeaseClaimStatus is the observed state of a claim, written only by the operator.
type FencedLeaseClaimStatus struct {
	// Phase: Pending -> Granted -> Expired | Revoked.
	Phase ClaimPhase `json:"phase,omitempty"`
	// FencingToken is the token this claim was granted.
	FencingToken *int64 `json:"fencingToken,omitempty"`
	// GrantTime is when the lease was granted to this claim.
	GrantTime *metav1.MicroTime `json:"grantTime,omitempty"`
	// LeaseDurationSeconds is this claim's term, fixed at its grant.
	LeaseDurationSeconds *int32 `json:"leaseDurationSeconds,omitempty"`
	// QueuePosition is the place in the queue while Pending (1 = next).
	QueuePosition *int32 `json:"queuePosition,omitempty"`
	// Message is a human-readable account of the phase.
	Message string `json:"message,omitempty"`
	// Conditions are the standard conditions (Granted, PodFound, LeaseFound).
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// ObservedGeneration is not set by the operator; kept for older clients.
	ObservedGeneration *int64 `json:"observedGeneration,omitempty"`
}

// FencedLeaseClaimList is a list of FencedLeaseClaims.
//
// +kubebuilder:object:root=true
type FencedLeaseClaimList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []FencedLeaseClaim `json:"items"`
}
