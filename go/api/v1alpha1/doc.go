// Package v1alpha1 holds the Go types of the fenced-lease custom resources, group fencing.dev,
// version v1alpha1: FencedLease (the lock) and FencedLeaseClaim (one candidate's request).
// They mirror crds/ (generated from the Rust types in crates/api/); a test fails when they drift.
//
// +kubebuilder:object:generate=true
// +groupName=fencing.dev
package v1alpha1

//go:generate go run sigs.k8s.io/controller-tools/cmd/controller-gen@v0.23.0 object paths=./...
