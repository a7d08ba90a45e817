package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

const (
	// Group is the API group of both kinds.
	Group = "fencing.dev"
	// Version is the API version of both kinds.
	Version = "v1alpha1"
	// LeasesResource is the plural resource name of FencedLease.
	LeasesResource = "fencedleases"
	// ClaimsResource is the plural resource name of FencedLeaseClaim.
	ClaimsResource = "fencedleaseclaims"
)

// SchemeGroupVersion is group fencing.dev, version v1alpha1.
var SchemeGroupVersion = schema.GroupVersion{Group: Group, Version: Version}

// GroupVersion is SchemeGroupVersion under the name kubebuilder projects use.
var GroupVersion = SchemeGroupVersion

// AddToScheme registers FencedLease and FencedLeaseClaim (and their lists) with a scheme.
func AddToScheme(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(SchemeGroupVersion,
		&FencedLease{}, &FencedLeaseList{},
		&FencedLeaseClaim{}, &FencedLeaseClaimList{},
	)
	metav1.AddToGroupVersion(scheme, SchemeGroupVersion)
	return nil
}
