// Package fence is the resource side from Go: every write carries the writer's fencing token
// and the protected resource refuses, atomically, any token lower than the highest it has
// accepted. A check done in application code (read, compare, write) would bring back the
// race the lease is there to remove, so each guard here is one conditional write at the
// resource:
//
//   - Kubernetes objects, checked by the apiserver itself (the admission policies of
//     deploy/admission/): Stamp, Delete, and NewClient, a controller-runtime client that
//     stamps every write with the current token;
//   - PostgreSQL, checked by SQL shipped in this repository (fence/postgres/), through pgx:
//     tables bound to a scope (postgres.Scope), every write checked against its mark, and
//     per-row marks (postgres.Table);
//   - Redis and Valkey keys, checked by a Redis Function library (fence/redis/), through
//     go-redis: a scope's keys under one mark (redis.Scope), or a key's own (redis.Set, Call).
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

// ErrNoToken is a write the resource refused because it presented no token (a PostgreSQL
// table bound to a scope): a statement outside a fenced transaction, a bug in the caller.
var ErrNoToken = errors.New("no fencing token presented")

// Fenced says a write was refused because the resource has accepted a higher token.
type Fenced struct {
	// Scope is the scope whose mark refused it, where the resource names one (a PostgreSQL
	// scope, a Redis fence key); empty otherwise.
	Scope string
	// Presented is the token the write carried.
	Presented int64
	// Highest is the token the resource holds (the highest it has accepted).
	Highest int64
	// Err is the resource's own answer, if it gave one (the apiserver's 403, so that
	// apierrors.IsForbidden still recognises the error); nil from PostgreSQL and Redis.
	Err error
}

func (f *Fenced) Error() string {
	what := "the resource"
	if f.Scope != "" {
		what = "scope " + f.Scope
	}
	return fmt.Sprintf("fenced out: token %d is lower than %d, the highest token %s has accepted", f.Presented, f.Highest, what)
}

// MarkAheadOf says whether the refusal came from a mark above leaseToken, the lease's last
// issued token: no holder of the lease ever had it, so it is not a newer holder's but a lost
// one's (a database restored from a backup, a lease re-created with its token records lost).
// Every write is refused until the mark is reset deliberately; retrying cannot fix it.
func (f *Fenced) MarkAheadOf(leaseToken int64) bool { return f.Highest > leaseToken }

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
