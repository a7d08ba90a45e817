// Package lock is a FencedLease as client-go's resourcelock.Interface, so that
// controller-runtime's own manager (or client-go's leaderelection.LeaderElector) elects with
// it: one manager per process, caches warm on standbys, metrics, probes and webhooks on every
// replica, controller-runtime's exit when leadership is lost, and the term's fencing token for
// every write.
//
//	lk, err := lock.New(ctx, cfg, lock.Config{Namespace: "payouts", Name: "payout-controller"})
//	opts, err := lk.ManagerOptions(ctrl.Options{Scheme: scheme})
//	mgr, err := ctrl.NewManager(cfg, opts) // mgr.GetClient() stamps every write
//	err = (&PayoutReconciler{Client: mgr.GetClient(), Tokens: lk}).SetupWithManager(mgr)
//	err = mgr.Start(ctx) // returns an error when leadership is lost: exit, and be restarted
//
// # How it elects
//
// The lock queues one FencedLeaseClaim for this candidate (FIFO, as every holder of the
// lease) when the elector first asks, and the operator grants it. The claim is renewed by
// the lease package, on its own schedule, with the local safe deadline of I6 (send time of
// the last accepted renew + the term's duration − the margin, on a clock that counts
// suspend) and the term's duration fixed at grant (I10). The elector's calls never reach the
// apiserver: Get describes the lease as the lock sees it (while the claim is queued it waits,
// at most LeaseDuration, for the grant, so that the elector leads within milliseconds of it
// rather than at its next RetryPeriod), and Update naming this candidate
// succeeds only while the term is held with more than RenewDeadline + 2 × RetryPeriod left
// before the local safe deadline.
//
// # client-go's durations and the FencedLease's
//
// client-go's elector believes it leads from a successful Update until a round of renew
// attempts (one every RetryPeriod) has failed for RenewDeadline: at most RetryPeriod +
// RenewDeadline after its last successful Update. Because Update needs that much time left
// before the local safe deadline, and one RetryPeriod more for the elector's own scheduling,
// the elector stops believing before the deadline passes. A term renewed on schedule (every
// third of its duration d) has d − d/3 − margin left just before a renew, so RenewDeadline +
// 2 × RetryPeriod must be below that (Timing.Check; New and ManagerOptions refuse settings
// that are not). DefaultTiming gives RenewDeadline + RetryPeriod half of that room, leaving the
// rest for renews that come late. LeaseDuration, which the elector uses only to decide when
// another candidate's unchanging record has expired and to pace its fast path, is the
// FencedLease's duration: the operator, not the elector, expires holders.
//
// After a term ends (lost, revoked, released), the lock refuses every Update for
// RenewDeadline + 2×RetryPeriod, so that the elector that led sees the loss and stops
// (OnStoppedLeading: controller-runtime then leaves the process) before a new claim is
// queued: a term's work never runs on into the next term. A new elector (a new process, or
// a new LeaderElector on the same lock) then leads again with a new token. If the elector
// stops renewing while the term is held, the lock releases the claim after the same window.
//
// client-go measures its durations on Go's monotonic clock, which on Linux stops while the
// machine is suspended: after a suspend the elector may believe it leads for up to
// RenewDeadline + RetryPeriod after resume. Token, and the stamping client that uses it,
// refuse at once: write with the token.
//
// # The token
//
// Lock.Token (a fence.TokenSource) is the term's fencing token while the term is held, with
// the local deadline check: give the Lock to reconcilers, or take it from their context
// with TokensFrom (ManagerOptions puts it in the manager's base context), and pass it to the
// PostgreSQL and Redis guards of package fence.
package lock
