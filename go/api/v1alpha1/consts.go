package v1alpha1

const (
	// TokenAnnotationPrefix prefixes the annotation that carries a lease's token on its
	// holder's pod: the full key is token.fencing.dev/<lease name>, one key per lease.
	TokenAnnotationPrefix = "token.fencing.dev"
	// LeaseLabel puts a Kubernetes object under a lease's fence: fencing.dev/lease: <lease>
	// (a FencedLease in the object's namespace).
	LeaseLabel = "fencing.dev/lease"
	// TokenAnnotation carries the fencing token of the last write to a fenced object, a
	// decimal integer. The apiserver refuses a write whose token is lower than the one stored.
	TokenAnnotation = "fencing.dev/token"
	// MaxLeaseNameLength is the longest lease name: the name part of an annotation key is
	// limited to 63 characters.
	MaxLeaseNameLength = 63
	// DefaultLeaseDurationSeconds is what the apiserver fills in when a spec leaves
	// leaseDurationSeconds out.
	DefaultLeaseDurationSeconds = 15
)

// TokenAnnotationKey is the pod annotation key that carries the token of lease leaseName.
func TokenAnnotationKey(leaseName string) string {
	return TokenAnnotationPrefix + "/" + leaseName
}
