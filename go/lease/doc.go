// Package lease holds a FencedLease from Go: Acquire queues a FencedLeaseClaim and waits for
// the operator's grant (WaitForever, NoWait, or a time limit), then renews it in the
// background. Lease.Token gives the fencing token only before the local safe deadline (send
// time of the last accepted renew + the term's duration − the margin, on a clock that counts
// suspend: CLOCK_BOOTTIME on Linux, CLOCK_MONOTONIC on macOS, the interrupt time on Windows, so a
// paused process or a suspended machine never wakes believing it holds); the term's duration
// is the one fixed at grant. Release, or cancelling the context given to Acquire, deletes the
// claim so that the next waiter is granted at once, and leaves no goroutine behind.
//
// Errors are told apart with errors.Is: ErrLost (a *LostError says why), ErrForbidden,
// ErrUnavailable, ErrTimeout, ErrLeaseNotFound.
package lease
