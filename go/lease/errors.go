package lease

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// Sentinels to test errors of this package with errors.Is.
var (
	// ErrLeaseNotFound: the FencedLease does not exist (claims for it would never be granted).
	ErrLeaseNotFound = errors.New("FencedLease not found")
	// ErrTimeout: Options.Wait passed before the grant; the claim was withdrawn.
	ErrTimeout = errors.New("FencedLease not acquired in time")
	// ErrLost: the lease is not (or no longer) held; the holder must stop acting on it.
	// Errors matching it are *LostError, which says why.
	ErrLost = errors.New("FencedLease not held")
	// ErrForbidden: the apiserver answered 403 (the holder lacks the Role in
	// deploy/rbac/holder-role.yaml, or changed a claim it did not create). Waiting does not
	// fix it.
	ErrForbidden = errors.New("forbidden")
	// ErrUnavailable: the Kubernetes API could not be reached or did not answer in time.
	ErrUnavailable = errors.New("Kubernetes API unavailable")
	// ErrInvalidMargin: the safety margin is not shorter than the lease duration.
	ErrInvalidMargin = errors.New("the safety margin must be shorter than the lease duration")
)

// Error is an error of this package with its kind (one of the sentinels above, matched by
// errors.Is) and its cause (the apiserver's answer or the client error, by errors.As).
type Error struct {
	// Kind is ErrLeaseNotFound, ErrTimeout, ErrForbidden, ErrUnavailable, ErrInvalidMargin,
	// or nil for any other API error.
	Kind error
	// What failed: the request, or the lease.
	What string
	// Err is the cause, if any.
	Err error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.What)
	if e.Kind != nil {
		b.WriteString(": ")
		b.WriteString(e.Kind.Error())
	}
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

// Is matches the error's Kind.
func (e *Error) Is(target error) bool { return e.Kind != nil && target == e.Kind }

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// LostReason says why a lease is not held.
type LostReason int

const (
	// NotGranted means the claim is still waiting; the lease was never granted to it.
	NotGranted LostReason = iota
	// DeadlinePassed means the local safe deadline passed without an accepted renew (the process
	// was paused, the machine suspended, the API unreachable).
	DeadlinePassed
	// Expired means the operator expired the claim (its heartbeat stopped).
	Expired
	// Revoked means the operator revoked the claim (its pod was deleted, or the status reset).
	Revoked
	// ClaimDeleted means someone deleted the claim.
	ClaimDeleted
	// LeaseDeleted means the FencedLease was deleted.
	LeaseDeleted
	// Superseded means the lease status names another holder, or a newer token.
	Superseded
	// Forbidden means the apiserver refused a heartbeat with 403.
	Forbidden
	// MarginTooLarge means the term's duration is not longer than the safety margin.
	MarginTooLarge
	// Released means the holder released the lease itself (Release, or its context ended).
	Released
)

var reasonText = [...]string{
	NotGranted:     "not granted (yet)",
	DeadlinePassed: "local safe deadline passed without a successful renew",
	Expired:        "expired by the operator (heartbeat stopped)",
	Revoked:        "revoked by the operator",
	ClaimDeleted:   "the claim was deleted",
	LeaseDeleted:   "the FencedLease was deleted",
	Superseded:     "no longer the holder",
	Forbidden:      "heartbeat forbidden",
	MarginTooLarge: "the term's duration is not longer than the safety margin",
	Released:       "released",
}

func (r LostReason) String() string {
	if int(r) < len(reasonText) {
		return reasonText[r]
	}
	return fmt.Sprintf("LostReason(%d)", int(r))
}

// stall reports a holder that stalled (or whose heartbeats were not seen): queueing again
// is the right response.
func (r LostReason) stall() bool { return r == DeadlinePassed || r == Expired }

// LostError says the lease is not held and why. It matches ErrLost.
type LostError struct {
	// Lease is namespace/name.
	Lease string
	// Token is the token that was granted (0: none).
	Token int64
	// Reason says why.
	Reason LostReason
	// Detail adds what the apiserver or the lease said, if anything.
	Detail string
}

func (e *LostError) Error() string {
	msg := fmt.Sprintf("FencedLease %s is not held: %s", e.Lease, e.Reason)
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	return msg
}

// Is matches ErrLost.
func (e *LostError) Is(target error) bool { return target == ErrLost }

// fromAPI sorts a failed request into the kinds above; what names the request.
func fromAPI(what string, err error) error {
	if err == nil {
		return nil
	}
	switch {
	case apierrors.IsForbidden(err):
		return &Error{Kind: ErrForbidden, What: what, Err: err}
	case transientAPIError(err):
		return &Error{Kind: ErrUnavailable, What: what, Err: err}
	}
	return &Error{What: what, Err: err}
}

// transientAPIError: an answer that may change by waiting (5xx, 429, timeouts, no
// connection), as opposed to the apiserver's considered refusal.
func transientAPIError(err error) bool {
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		code := status.Status().Code
		return code == http.StatusTooManyRequests || code >= 500 ||
			apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err)
	}
	return true // transport errors: refused, reset, deadline exceeded
}

func timedOut(what string, after time.Duration) error {
	return &Error{Kind: ErrUnavailable, What: fmt.Sprintf("%s: no answer within %v", what, after)}
}

// retryable: worth trying again later (the API may come back).
func retryable(err error) bool {
	return errors.Is(err, ErrUnavailable) || apierrors.IsConflict(err)
}

// retryAfter is how long the apiserver asked to wait before retrying (429 and some 5xx).
func retryAfter(err error) time.Duration {
	if seconds, ok := apierrors.SuggestsClientDelay(err); ok && seconds > 0 {
		return time.Duration(seconds) * time.Second
	}
	return 0
}
