//! Queue positions waiting to be written. Every hand-over moves every waiter one place up;
//! writing those positions in the reconcile would put one claim write per waiter between a
//! hand-over and the next. So the reconcile writes what a grant needs (the lease, the claim
//! that ends, the new holder, a new claim's first answer) and leaves position moves here. A
//! newer set for a lease replaces the older one; the writer task
//! ([`reconcile::positions`](crate::reconcile::positions)) writes a lease's set once no
//! reconcile of the lease has left a newer one for [`QUIET`], or [`MAX_AGE`] after its positions
//! first moved, whichever comes first, a write at a time.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::names::LeaseKey;
use crate::state::claim::CachedClaimStatus;
use fenced_lease_api::{ClaimPhase, FencedLeaseClaimStatus};

/// A lease's queue must be still this long before its positions are written.
pub const QUIET: Duration = Duration::from_millis(250);
/// ... or its positions have been out of date this long, under a steady stream of hand-overs.
pub const MAX_AGE: Duration = Duration::from_secs(5);

/// One waiting claim's new position, as the reconcile decided it. The claim goes by name: the
/// writer writes it only while the claim's freshest cached copy still just waits, conditional
/// on that copy's `resourceVersion`.
#[derive(Clone, Debug)]
pub struct PositionWrite {
    pub claim: String,
    pub status: FencedLeaseClaimStatus,
}

/// Whether `desired` differs from a waiting claim's `current` status only in its place in the
/// queue (`queuePosition` and the message that says it): a move, left for the writer task.
/// Anything else (a first answer, a grant, an end, a pod found missing) is written at once.
pub fn only_moved(current: Option<&CachedClaimStatus>, desired: &FencedLeaseClaimStatus) -> bool {
    let Some(current) = current else {
        return false;
    };
    if current.phase != Some(ClaimPhase::Pending) || desired.phase != Some(ClaimPhase::Pending) {
        return false;
    }
    let unmoved = FencedLeaseClaimStatus {
        queue_position: current.queue_position,
        message: current.message.as_deref().map(str::to_owned),
        ..desired.clone()
    };
    *current == unmoved
}

/// Position writes waiting, by lease.
#[derive(Debug, Default)]
pub struct Positions {
    inner: Mutex<HashMap<LeaseKey, Pending>>,
    /// A set was left: the writer looks at what is due.
    pub changed: Notify,
}

#[derive(Debug)]
struct Pending {
    writes: Vec<PositionWrite>,
    /// When the positions of this set first moved.
    first: Instant,
    /// When the queue last moved.
    last: Instant,
}

/// The set of a lease that is due, with the lease's namespace and name.
pub type Due = (String, String, Vec<PositionWrite>);

/// Whether a set whose positions first moved at `first` and last at `last` is due at `now`.
pub fn is_due(first: Instant, last: Instant, now: Instant) -> bool {
    now >= last + QUIET || now >= first + MAX_AGE
}

impl Positions {
    /// Lease `ns/name`'s waiters should show `writes` (all that differ from their cached
    /// status; none: nothing to write). Replaces the lease's earlier set, keeping when it
    /// first moved.
    pub fn leave(&self, ns: &str, name: &str, writes: Vec<PositionWrite>, now: Instant) {
        let key = LeaseKey::new(ns, name);
        let mut inner = super::locked(&self.inner);
        if writes.is_empty() {
            inner.remove(&key);
            return;
        }
        let first = inner.get(&key).map_or(now, |p| p.first);
        inner.insert(
            key,
            Pending {
                writes,
                first,
                last: now,
            },
        );
        drop(inner);
        self.changed.notify_one();
    }

    /// Takes the sets due at `now`; says when the next of the others comes due.
    pub fn take_due(&self, now: Instant) -> (Vec<Due>, Option<Instant>) {
        let mut inner = super::locked(&self.inner);
        let due = inner
            .extract_if(|_, p| is_due(p.first, p.last, now))
            .map(|(key, p)| (key.namespace().into(), key.name().into(), p.writes))
            .collect();
        let next = inner
            .values()
            .map(|p| (p.last + QUIET).min(p.first + MAX_AGE))
            .min();
        (due, next)
    }

    /// Lease `ns/name` is gone: nothing of it to write.
    pub fn forget(&self, ns: &str, name: &str) {
        super::locked(&self.inner).remove(&LeaseKey::new(ns, name));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(name: &str) -> PositionWrite {
        PositionWrite {
            claim: name.into(),
            status: Default::default(),
        }
    }

    fn pending(position: Option<i32>, message: &str) -> FencedLeaseClaimStatus {
        FencedLeaseClaimStatus {
            phase: Some(ClaimPhase::Pending),
            queue_position: position,
            message: Some(message.into()),
            ..Default::default()
        }
    }

    #[test]
    fn only_a_waiting_claims_place_in_the_queue_is_left_for_later() {
        let at_3 = CachedClaimStatus::from(pending(Some(3), "position 3"));
        assert!(only_moved(Some(&at_3), &pending(Some(2), "position 2")));
        assert!(only_moved(
            Some(&at_3),
            &pending(None, "more than 100 ahead")
        ));
        // A first answer, a grant, a changed condition: at once.
        assert!(!only_moved(None, &pending(Some(2), "position 2")));
        let granted = FencedLeaseClaimStatus {
            phase: Some(ClaimPhase::Granted),
            fencing_token: Some(4),
            ..Default::default()
        };
        assert!(!only_moved(Some(&at_3), &granted));
        let mut pod_gone = pending(Some(2), "waiting for pod p to exist");
        pod_gone.conditions.push(
            serde_json::from_value(serde_json::json!({
                "type": "PodFound", "status": "False", "reason": "PodNotFound", "message": "",
                "lastTransitionTime": "2026-12-01T00:00:00Z",
            }))
            .expect("condition"),
        );
        assert!(!only_moved(Some(&at_3), &pod_gone));
    }

    #[test]
    fn a_set_is_due_once_the_queue_is_still_or_it_is_old() {
        let t0 = Instant::now();
        assert!(!is_due(t0, t0, t0 + QUIET / 2));
        assert!(is_due(t0, t0, t0 + QUIET));
        // The queue keeps moving: due at MAX_AGE after the first move all the same.
        let moving = t0 + MAX_AGE - QUIET / 2;
        assert!(!is_due(t0, moving, t0 + MAX_AGE - Duration::from_millis(1)));
        assert!(is_due(t0, moving, t0 + MAX_AGE));
    }

    #[test]
    fn a_newer_set_replaces_the_older_and_keeps_its_age() {
        let p = Positions::default();
        let t0 = Instant::now();
        p.leave("ns", "l", vec![write("a"), write("b")], t0);
        let later = t0 + QUIET / 2;
        p.leave("ns", "l", vec![write("b")], later);
        // Not still long enough since the last move.
        let (due, next) = p.take_due(later + QUIET / 2);
        assert!(due.is_empty());
        assert_eq!(next, Some(later + QUIET));
        let (due, next) = p.take_due(later + QUIET);
        assert_eq!(due.len(), 1);
        let (ns, lease, writes) = &due[0];
        assert_eq!((ns.as_str(), lease.as_str()), ("ns", "l"));
        let names: Vec<_> = writes.iter().map(|w| w.claim.as_str()).collect();
        assert_eq!(names, ["b"]);
        assert_eq!(next, None);
        assert!(crate::state::locked(&p.inner).is_empty());

        // Moving every QUIET/2: written at MAX_AGE after the first move, not never.
        let mut at = t0;
        while at < t0 + MAX_AGE {
            p.leave("ns", "l", vec![write("c")], at);
            at += QUIET / 2;
        }
        assert_eq!(p.take_due(t0 + MAX_AGE).0.len(), 1);
    }

    #[test]
    fn nothing_to_write_or_a_gone_lease_cancels_the_set() {
        let p = Positions::default();
        let t0 = Instant::now();
        p.leave("ns", "l", vec![write("a")], t0);
        p.leave("ns", "l", vec![], t0);
        assert!(crate::state::locked(&p.inner).is_empty());
        p.leave("ns", "m", vec![write("a")], t0);
        p.forget("ns", "m");
        let (due, next) = p.take_due(t0 + MAX_AGE);
        assert!(due.is_empty() && next.is_none());
    }
}
