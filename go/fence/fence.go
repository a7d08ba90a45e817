// Package fence is the resource side from Go: every write carries the writer's fencing token
// and the protected resource refuses, atomically, any token lower than the highest it has
// accepted. A check done in application code (read, compare, write) would bring back the
// race the lease is there to remove, so each guard here is one conditional write at the
// resource:
//
//   - Kubernetes objects, checked by the apiserver itself (the admission policies of
//     deploy/admission/): Stamp, Delete, and NewClient, a controller-runtime client that
//     stamps every write with the current token;
//   - PostgreSQL rows, checked by SQL shipped in this repository (fence/postgres/), through
//     pgx: Table;
//   - Redis and Valkey keys, checked by a Redis Function library (fence/redis/), through
//     go-redis: RedisSet, RedisCall.
//
// Every guard reports a stale writer the same way: a *Fenced error (errors.Is(err,
// ErrFenced)), or a *NotHolder when the apiserver refused the writer's pod by identity.
package fence

import (
	"errors"
	"fmt"
)

// ErrFenced matches every refusal of a stale writer: *Fenced and *NotHolder. A writer that
// gets it must stop, not retry: a newer holder exists.
var ErrFenced = errors.New("fenced out")

// ErrInvalidToken is a token no lease issues: negative, or above MaxToken. It is a bug in the
// caller.
var ErrInvalidToken = errors.New("invalid fencing token")

// MaxToken is the largest fencing token, 2^53 - 1: every shipped fence compares tokens up to it
// exactly (the admission policies, PostgreSQL's bigint, Redis, whose numbers are doubles), so
// the operator issues none above it.
const MaxToken int64 = 1<<53 - 1

// Fenced says a write was refused because the resource has accepted a higher token.
type Fenced struct {
	// Presented is the token the write carried.
	Presented int64
	// Highest is the token the resource holds (the highest it has accepted).
	Highest int64
	// Err is the resource's own answer, if it gave one (the apiserver's 403, so that
	// apierrors.IsForbidden still recognises the error); nil from PostgreSQL and Redis.
	Err error
}

func (f *Fenced) Error() string {
	return fmt.Sprintf("fenced out: token %d is lower than %d, the highest token the resource has accepted", f.Presented, f.Highest)
}

// Is matches ErrFenced.
func (f *Fenced) Is(target error) bool { return target == ErrFenced }

// Unwrap is the resource's own answer (nil if none).
func (f *Fenced) Unwrap() error { return f.Err }

// NotHolder says the apiserver refused the write because the writer's pod does not hold the
// lease that fences the object (the identity rule, I11).
type NotHolder struct {
	// Message is the apiserver's account, after "fenced: ".
	Message string
	// Err is the apiserver's 403, so that apierrors.IsForbidden still recognises the error.
	Err error
}

func (n *NotHolder) Error() string { return "fenced out: " + n.Message }

// Is matches ErrFenced.
func (n *NotHolder) Is(target error) bool { return target == ErrFenced }

// Unwrap is the apiserver's 403.
func (n *NotHolder) Unwrap() error { return n.Err }

// Accepts is the rule every guard applies atomically: a write carrying token is accepted
// when it is at least the highest token accepted so far. Equal is accepted so that one
// holder can write many times.
func Accepts(highest, token int64) bool { return token >= highest }

// CheckToken refuses, with ErrInvalidToken, a token no lease issues (negative, or above
// MaxToken), before any write is attempted.
func CheckToken(token int64) error {
	if token < 0 || token > MaxToken {
		return fmt.Errorf("%w %d: tokens are integers from 0 to %d (2^53 - 1)", ErrInvalidToken, token, MaxToken)
	}
	return nil
}
