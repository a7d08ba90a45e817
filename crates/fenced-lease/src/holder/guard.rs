//! The guard a holder gets once granted: its token (only while inside the local safe
//! deadline), the `lost` signal, and release.

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::clock::{self, BootInstant};
use super::error::{Error, LostReason};
use super::keeper::{Keeper, Shared};
use super::state::HoldState;

/// Why a guard refused a holder's write ([`LeaseHandle::refusal`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The lease moved on and a newer holder wrote: stop, do not retry.
    NewerHolder,
    /// The resource's mark is above every token the lease has issued, though this holder
    /// still holds it: the resource was restored from a backup, or the lease re-created with
    /// its token records lost. Every write is refused until someone resets the mark
    /// deliberately (PostgreSQL: `fenced_lease.reset`); retrying cannot help.
    MarkAhead,
}

/// A read-only, cloneable view of a held lease, for the tasks that do the holder's work.
#[derive(Clone)]
pub struct LeaseHandle {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for LeaseHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseHandle")
            .field("namespace", &self.shared.namespace)
            .field("lease", &self.shared.lease)
            .field("claim", &self.shared.claim)
            .field("state", &self.state())
            .finish()
    }
}

impl LeaseHandle {
    /// The fencing token, while the lease is held. Checks the local safe deadline on every
    /// call, so it never answers `Ok` past it, even when the renew task could not run or the
    /// machine was suspended.
    pub fn token(&self) -> Result<i64, Error> {
        let now = BootInstant::now();
        let result = self.shared.snapshot().token_at(now);
        result.map_err(|reason| {
            self.shared.check_deadline(now);
            Error::Lost {
                lease: self.shared.lease.clone(),
                token: self.granted_token(),
                reason,
            }
        })
    }

    /// Whether the lease is held now (see [`token`](Self::token)).
    pub fn is_held(&self) -> bool {
        self.token().is_ok()
    }

    /// What a guard's refusal of this holder's write means, or `None` for an error that is no
    /// refusal. While the lease is held nobody has a higher token, so a mark above this
    /// holder's token is a lost one's ([`Refusal::MarkAhead`]); otherwise a newer holder wrote.
    ///
    /// A refusal is also reported: an error log line with the lease and both tokens, a count
    /// in [`register_metrics`](super::register_metrics)'s counter, and a Warning Event
    /// `WriteRefused` on the FencedLease (the first at once, then at most one call per lease
    /// per 10 s), which the operator counts for its critical alert. Call it on every error of
    /// a guarded write; [`reported`](Self::reported) waits until the Event is sent.
    pub fn refusal(&self, error: &crate::fence::Error) -> Option<Refusal> {
        if !error.is_fenced() {
            return None;
        }
        let granted = self.granted_token();
        let refusal = match self.token() {
            Ok(token) if error.mark_ahead_of(token) => Refusal::MarkAhead,
            _ => Refusal::NewerHolder,
        };
        let (scope, presented, highest) = match error {
            crate::fence::Error::Fenced {
                scope,
                presented,
                highest,
            } => (scope.as_deref(), Some(*presented), Some(*highest)),
            _ => (None, granted, None),
        };
        let shared = &self.shared;
        tracing::error!(
            namespace = %shared.namespace, lease = %shared.lease, claim = %shared.claim,
            scope, presented, highest, ?refusal, %error,
            "write refused: a stale token (a newer holder wrote, or the resource's mark is ahead)"
        );
        let who = match granted {
            Some(token) => format!("claim {} (token {token})", shared.claim),
            None => format!("claim {}", shared.claim),
        };
        shared.reports.record(format!("{who}: {error}"));
        Some(refusal)
    }

    /// Reports a refusal for a stale token that this program learned of by other means than a
    /// guard's error ([`refusal`](Self::refusal) classifies those): a child process's exit code
    /// (`kubectl fence run --refused-exit-code`), say. Logs, counts and sends the Event as
    /// `refusal` does; `what` says what was refused.
    pub fn report_refusal(&self, what: &str) {
        let shared = &self.shared;
        tracing::error!(
            namespace = %shared.namespace, lease = %shared.lease, claim = %shared.claim,
            token = ?self.granted_token(), what, "write refused: a stale token"
        );
        shared
            .reports
            .record(format!("claim {}: {what}", shared.claim));
    }

    /// Waits until the refusals reported so far ([`refusal`](Self::refusal)) are sent to the
    /// apiserver as an Event (at most two request timeouts): call it before the process exits.
    /// [`LeaseGuard::release`] does.
    pub async fn reported(&self) {
        self.shared.reports.flush().await;
    }

    /// The token this claim was granted, held or not (for logs; use [`token`](Self::token)
    /// to act).
    pub fn granted_token(&self) -> Option<i64> {
        match self.shared.snapshot().state {
            HoldState::Holding { token } => Some(token),
            HoldState::Lost { token, .. } => token,
            HoldState::Waiting { .. } => None,
        }
    }

    /// The hold state now: like [`token`](Self::token), it checks the local safe deadline,
    /// so it never says `Holding` past it.
    pub fn state(&self) -> HoldState {
        self.shared.check_deadline(BootInstant::now());
        self.shared.snapshot().state
    }

    /// Time left before the local safe deadline (zero once it has passed, or when the lease
    /// is not held). A renew moves the deadline on.
    pub fn time_left(&self) -> Duration {
        let now = BootInstant::now();
        let t = self.shared.snapshot();
        match t.token_at(now) {
            Ok(_) => t.deadline().saturating_duration_since(now),
            Err(_) => Duration::ZERO,
        }
    }

    /// Where the local safe deadline of the latest term stands: `Ok(left)` while it is
    /// ahead, `Err(ago)` once it has passed. Unlike [`time_left`](Self::time_left) it still
    /// answers after the lease is lost or released, for logs and post-mortems.
    pub fn deadline_from_now(&self) -> Result<Duration, Duration> {
        let now = BootInstant::now();
        let deadline = self.shared.snapshot().deadline();
        match deadline.saturating_duration_since(now) {
            Duration::ZERO => Err(now.saturating_duration_since(deadline)),
            left => Ok(left),
        }
    }

    /// The lease duration in force for this claim: the term's, fixed at grant (I10).
    pub fn lease_duration(&self) -> Duration {
        self.shared.timing().duration
    }

    /// Resolves when the lease is lost or released, at the latest at the local safe
    /// deadline (from its own timer, so also when the renew task is starved; within a second
    /// of resume after a suspend).
    pub async fn lost(&self) -> LostReason {
        let mut rx = self.shared.subscribe();
        loop {
            let (holding, deadline) = {
                let t = rx.borrow_and_update();
                if let HoldState::Lost { reason, .. } = &t.state {
                    return reason.clone();
                }
                (t.is_holding(), t.deadline())
            };
            tokio::select! {
                _ = clock::sleep_until(deadline), if holding => {
                    self.shared.check_deadline(BootInstant::now());
                }
                changed = rx.changed() => {
                    if changed.is_err() {
                        return LostReason::Released;
                    }
                }
            }
        }
    }

    /// A token cancelled when the lease is lost or released: tie the holder's work to it.
    pub fn cancellation(&self) -> CancellationToken {
        self.shared.stop.child_token()
    }

    /// Namespace of the lease.
    pub fn namespace(&self) -> &str {
        &self.shared.namespace
    }

    /// Name of the lease.
    pub fn lease(&self) -> &str {
        &self.shared.lease
    }

    /// Name of this holder's `FencedLeaseClaim`.
    pub fn claim(&self) -> &str {
        &self.shared.claim
    }

    /// The holder identity written in the claim.
    pub fn identity(&self) -> &str {
        &self.shared.identity
    }
}

/// A granted lease. Renews in the background; [`release`](Self::release) deletes the claim
/// so that the next waiter is granted at once. Dropping it releases the lease too: on the
/// multi-threaded runtime the drop waits for the deletion (at most one request timeout), so
/// that it is done even when the runtime shuts down right after; on a current-thread runtime
/// it is left to a spawned task, which a runtime shutting down may never run (call
/// `release` there).
#[must_use = "dropping the guard releases the lease at once: bind it, e.g. `let guard = acquire(...).await?;`"]
pub struct LeaseGuard {
    handle: LeaseHandle,
    keeper: Keeper,
}

impl std::fmt::Debug for LeaseGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.handle.fmt(f)
    }
}

impl Deref for LeaseGuard {
    type Target = LeaseHandle;

    fn deref(&self) -> &LeaseHandle {
        &self.handle
    }
}

impl LeaseGuard {
    pub(crate) fn new(keeper: Keeper) -> Self {
        LeaseGuard {
            handle: LeaseHandle {
                shared: keeper.shared.clone(),
            },
            keeper,
        }
    }

    /// A cloneable view for other tasks; it stops reporting the lease as held once this
    /// guard is released or dropped.
    pub fn handle(&self) -> LeaseHandle {
        self.handle.clone()
    }

    /// Stops acting as holder at once, then deletes the claim so that the next waiter is
    /// granted without waiting for expiry; meanwhile sends the refusals not yet reported
    /// ([`LeaseHandle::reported`]). Cancel-safe: dropping this future (a `select!`, a
    /// timeout) does not stop the deletion.
    pub async fn release(self) -> Result<(), Error> {
        let (discarded, ()) = tokio::join!(
            self.keeper.discard(LostReason::Released),
            self.handle.reported()
        );
        discarded
    }

    /// Stops renewing and leaves the claim in place, for a caller that takes over the
    /// heartbeat (or lets the claim expire): `kubectl fence acquire`.
    pub fn detach(self) -> DetachedClaim {
        let claim = DetachedClaim {
            namespace: self.handle.namespace().into(),
            lease: self.handle.lease().into(),
            claim: self.handle.claim().into(),
            identity: self.handle.identity().into(),
            token: self.handle.granted_token(),
            lease_duration: self.handle.lease_duration(),
        };
        self.keeper.detach();
        claim
    }
}

/// A granted claim left in place by [`LeaseGuard::detach`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
#[serde(rename_all = "camelCase")]
pub struct DetachedClaim {
    /// Namespace of the lease.
    pub namespace: String,
    /// Lease name.
    pub lease: String,
    /// Claim name: delete it to release.
    pub claim: String,
    /// Holder identity.
    pub identity: String,
    /// The token granted.
    pub token: Option<i64>,
    /// The claim expires this long after its last heartbeat.
    #[serde(with = "humantime_serde_secs")]
    pub lease_duration: std::time::Duration,
}

mod humantime_serde_secs {
    pub fn serialize<S: serde::Serializer>(
        d: &std::time::Duration,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::holder::claim::ClaimView;
    use crate::holder::state::Tracker;

    /// A handle on a claim granted token 7 whose deadline passes `after` from now.
    fn handle(after: Duration) -> LeaseHandle {
        let duration = Duration::from_secs(10);
        let margin = Duration::from_secs(1);
        let sent = BootInstant::now() + after - (duration - margin);
        let mut tracker = Tracker::new("db-x", sent, duration, Some(margin), None);
        let granted = ClaimView {
            phase: Some(crate::api::ClaimPhase::Granted),
            token: Some(7),
            ..Default::default()
        };
        tracker.observe_claim(&granted, sent);
        LeaseHandle {
            shared: Shared::for_test("db", "db-x", tracker),
        }
    }

    #[test]
    fn state_and_token_check_the_deadline() {
        let held = handle(Duration::from_secs(5));
        assert_eq!(held.state(), HoldState::Holding { token: 7 });
        assert_eq!(held.token().unwrap(), 7);
        assert!(held.time_left() > Duration::from_secs(4));

        // The renew task never ran (a starved runtime, a suspended machine): the state the
        // tracker last recorded says Holding, but the deadline has passed.
        let stale = handle(Duration::ZERO);
        assert_eq!(
            stale.state(),
            HoldState::Lost {
                token: Some(7),
                reason: LostReason::DeadlinePassed
            }
        );
        assert!(stale.token().is_err());
        assert_eq!(stale.time_left(), Duration::ZERO);
        assert!(stale.cancellation().is_cancelled());
    }

    #[test]
    fn a_refusal_by_a_mark_above_the_held_token_is_a_lost_mark() {
        let refused = |highest| crate::fence::Error::Fenced {
            scope: Some("shop/payouts".into()),
            presented: 7,
            highest,
        };
        let held = handle(Duration::from_secs(5));
        assert_eq!(held.refusal(&refused(9)), Some(Refusal::MarkAhead));
        let lost = handle(Duration::ZERO);
        assert_eq!(lost.refusal(&refused(9)), Some(Refusal::NewerHolder));
        let other = crate::fence::Error::InvalidName("x".into());
        assert_eq!(held.refusal(&other), None);
    }
}
