//! The next step of writing a lease's status. The decision reads the caches, and the caches
//! can be behind the API; so before the status a decision implies is written, whatever the
//! decision rests on that a cache alone may not decide is read from the API, in this order:
//!
//! 1. **Read the lease** when a claim shows a grant this copy of the lease does not: the lease
//!    cache lags the claim cache, and deciding on it would revoke the holder the lease has.
//! 2. **Confirm the holder** is gone when the decision ends its hold because its claim or
//!    pod is missing from the cache: only the API may say so.
//! 3. **Expire** the claims whose heartbeat stopped, each made final by a write preconditioned
//!    on a version that shows the heartbeat last seen (I9), before the lease may move on.
//! 4. **Read the followed Lease** (a lease with `spec.follow`) before its holder changes: a
//!    cache that lags the Lease (an operator paused, then resumed) must never hand the lease
//!    back to a holder the Lease has since replaced. Read after the lease copy decided on, so
//!    a write preconditioned on that copy carries a decision no older than it.
//! 5. **Read the token record** before the first grant of a lease object: tokens continue
//!    above the last one issued under its name (I1).
//! 6. **Record a token above the clock** before it is issued: a token the wall clock has not
//!    reached (a `minToken` or a record above the clock) is what a lease re-created under the
//!    same name could not rise above by the clock, so it goes into the token record first,
//!    where a stripped finalizer cannot take it (I1).
//! 7. **Write** the status, or be **done** when it already says so.
//!
//! After each read the reconcile decides again on what it learnt; [`next_step`] is given
//! what it knows and what the decision said, and names the one thing to do next.

use crate::core::decide::{EndReason, Plan};
use fenced_lease_api::FencedLeaseStatus;

/// What the reconcile has learnt from the API so far.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Known {
    /// The lease was read from the API.
    pub lease_read: bool,
    /// The holder (claim UID) whose end the API was asked to confirm.
    pub holder_checked: Option<String>,
    /// The token record of the lease's name, once read.
    pub record: Option<i64>,
    /// The followed Lease was read from the API since the lease copy decided on was.
    pub followed_read: bool,
    /// The token this reconcile has written into the token record ahead of its grant.
    pub recorded_ahead: Option<i64>,
}

/// What this round's decision rests on and says.
#[derive(Clone, Copy, Debug)]
pub struct Round<'a> {
    /// The lease status as last read (cache or API).
    pub current: &'a FencedLeaseStatus,
    /// The highest token a `Granted` claim shows.
    pub newest_grant: i64,
    pub plan: &'a Plan,
    /// The status the plan implies is the current one.
    pub unchanged: bool,
    /// The wall clock, ms since the Unix epoch: a token above it is recorded before it is
    /// issued.
    pub now_ms: i64,
}

/// One step of writing a lease's status (see the module's list for the order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    ReadLease,
    ConfirmHolder,
    Expire,
    ReadFollowed,
    ReadRecord,
    /// Record this token, the grant's, before it is issued.
    RecordAhead(i64),
    Write,
    Done,
}

/// The step to take next.
pub fn next_step(known: &Known, round: &Round) -> Step {
    let (current, plan) = (round.current, round.plan);
    if !known.lease_read && round.newest_grant > current.fencing_token {
        return Step::ReadLease;
    }
    if let (Some(ended), Some(holder)) = (&plan.ended, &current.holder)
        && matches!(ended.reason, EndReason::Released | EndReason::PodDeleted)
        && !holder.claim.is_empty()
        && known.holder_checked.as_deref() != Some(holder.claim_uid.as_str())
    {
        return Step::ConfirmHolder;
    }
    if !plan.expire.is_empty() {
        return Step::Expire;
    }
    let changes_hands = plan.ended.is_some() || plan.grant.is_some();
    if plan.follows.is_some() && changes_hands && !known.followed_read {
        return Step::ReadFollowed;
    }
    if plan.grant.is_some() && current.fencing_token == 0 && known.record.is_none() {
        return Step::ReadRecord;
    }
    if let Some(grant) = &plan.grant
        && grant.token > round.now_ms
        && known.recorded_ahead.is_none_or(|t| t < grant.token)
    {
        return Step::RecordAhead(grant.token);
    }
    if round.unchanged {
        Step::Done
    } else {
        Step::Write
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::decide::{Ended, Grant};
    use fenced_lease_api::LeaseHolder;

    fn held(token: i64) -> FencedLeaseStatus {
        FencedLeaseStatus {
            fencing_token: token,
            holder: Some(LeaseHolder {
                claim: "a".into(),
                claim_uid: "uid-a".into(),
                identity: "pod-a".into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// A plan that ends the holder for `reason`, grants, and expires as asked.
    fn plan(end: Option<EndReason>, grant: bool, expire: &[&str]) -> Plan {
        Plan {
            ended: end.map(|reason| Ended {
                uid: "uid-a".into(),
                reason,
            }),
            grant: grant.then(|| Grant {
                claim: "b".into(),
                uid: "uid-b".into(),
                token: 1,
            }),
            expire: expire.iter().map(|s| s.to_string()).collect(),
            ..Plan::default()
        }
    }

    fn step(known: &Known, current: &FencedLeaseStatus, newest: i64, plan: &Plan) -> Step {
        let round = Round {
            current,
            newest_grant: newest,
            plan,
            unchanged: false,
            now_ms: NOW_MS,
        };
        next_step(known, &round)
    }

    const NOW_MS: i64 = 1_764_500_000_000;

    #[test]
    fn a_lagging_lease_copy_is_read_before_anything_else() {
        // Everything else is asked for too: the lease is read first, and only once.
        let p = plan(Some(EndReason::Released), true, &["uid-c"]);
        let fresh = FencedLeaseStatus::default();
        assert_eq!(step(&Known::default(), &fresh, 3, &p), Step::ReadLease);
        let read = Known {
            lease_read: true,
            ..Default::default()
        };
        assert_ne!(step(&read, &fresh, 3, &p), Step::ReadLease);
        // Before confirming a holder the cache misses, too.
        assert_eq!(step(&Known::default(), &held(3), 5, &p), Step::ReadLease);
        // A claim that shows no newer grant than the lease: no read.
        assert_ne!(step(&Known::default(), &held(3), 3, &p), Step::ReadLease);
    }

    #[test]
    fn a_holder_missing_from_the_cache_is_confirmed_before_expiries_and_grants() {
        let p = plan(Some(EndReason::PodDeleted), true, &["uid-c"]);
        assert_eq!(
            step(&Known::default(), &held(3), 3, &p),
            Step::ConfirmHolder
        );
        // Confirmed once per holder: then the expiry comes next.
        let checked = Known {
            holder_checked: Some("uid-a".into()),
            ..Default::default()
        };
        assert_eq!(step(&checked, &held(3), 3, &p), Step::Expire);
        // Another holder since (a 409 re-read): confirmed again.
        let other = Known {
            holder_checked: Some("uid-z".into()),
            ..Default::default()
        };
        assert_eq!(step(&other, &held(3), 3, &p), Step::ConfirmHolder);
        // Ends the cache does not decide alone are not confirmed: an expiry is (step 3).
        let expired = plan(Some(EndReason::Expired), false, &["uid-a"]);
        assert_eq!(step(&Known::default(), &held(3), 3, &expired), Step::Expire);
    }

    #[test]
    fn expiries_come_before_the_record_and_the_write() {
        let p = plan(None, true, &["uid-c"]);
        let none = FencedLeaseStatus::default();
        assert_eq!(step(&Known::default(), &none, 0, &p), Step::Expire);
        let p = plan(None, true, &[]);
        assert_eq!(step(&Known::default(), &none, 0, &p), Step::ReadRecord);
    }

    #[test]
    fn the_record_is_read_once_and_only_before_a_first_grant() {
        let p = plan(None, true, &[]);
        let none = FencedLeaseStatus::default();
        let read = Known {
            record: Some(41),
            ..Default::default()
        };
        assert_eq!(step(&read, &none, 0, &p), Step::Write);
        // A lease that has issued a token continues from it.
        let released = FencedLeaseStatus {
            fencing_token: 5,
            ..Default::default()
        };
        assert_eq!(step(&Known::default(), &released, 5, &p), Step::Write);
    }

    #[test]
    fn a_token_above_the_clock_is_recorded_before_it_is_issued() {
        let above = |token: i64| {
            let mut p = plan(None, true, &[]);
            if let Some(grant) = p.grant.as_mut() {
                grant.token = token;
            }
            p
        };
        let released = FencedLeaseStatus {
            fencing_token: NOW_MS + 5_000,
            ..Default::default()
        };
        let newest = released.fencing_token;
        // At or below the clock: the clock floor covers it, no record.
        assert_eq!(
            step(&Known::default(), &released, newest, &above(NOW_MS)),
            Step::Write
        );
        // Above it: recorded first, once; a later, higher grant of the same reconcile again.
        let token = NOW_MS + 5_001;
        assert_eq!(
            step(&Known::default(), &released, newest, &above(token)),
            Step::RecordAhead(token)
        );
        let recorded = Known {
            recorded_ahead: Some(token),
            ..Default::default()
        };
        assert_eq!(
            step(&recorded, &released, newest, &above(token)),
            Step::Write
        );
        assert_eq!(
            step(&recorded, &released, newest, &above(token + 1)),
            Step::RecordAhead(token + 1)
        );
        // A first grant reads the record before it records ahead (the token rests on it).
        let fresh = FencedLeaseStatus::default();
        assert_eq!(
            step(&Known::default(), &fresh, 0, &above(token)),
            Step::ReadRecord
        );
        let read = Known {
            record: Some(token - 1),
            ..Default::default()
        };
        assert_eq!(
            step(&read, &fresh, 0, &above(token)),
            Step::RecordAhead(token)
        );
    }

    #[test]
    fn a_followed_lease_is_read_before_its_holder_changes_and_only_then() {
        let follow = |p: Plan| Plan {
            follows: Some(crate::core::decide::Follow {
                lease: "ctrl".into(),
                state: crate::core::decide::FollowState::Held,
                holder: None,
            }),
            ..p
        };
        let none = FencedLeaseStatus::default();
        let grant = follow(plan(None, true, &[]));
        assert_eq!(
            step(&Known::default(), &none, 0, &grant),
            Step::ReadFollowed
        );
        let read = Known {
            followed_read: true,
            ..Default::default()
        };
        assert_eq!(step(&read, &none, 0, &grant), Step::ReadRecord);
        let end = follow(plan(Some(EndReason::Followed), false, &[]));
        assert_eq!(
            step(&Known::default(), &held(3), 3, &end),
            Step::ReadFollowed
        );
        assert_eq!(step(&read, &held(3), 3, &end), Step::Write);
        // Nothing changes hands: no read.
        let keep = follow(plan(None, false, &[]));
        assert_eq!(step(&Known::default(), &held(3), 3, &keep), Step::Write);
        // A followed holder (no claim) that ends because the lease stopped following is not
        // confirmed through a claim: there is none.
        let mut followed = held(3);
        if let Some(h) = followed.holder.as_mut() {
            (h.claim, h.claim_uid) = (String::new(), String::new());
        }
        let released = plan(Some(EndReason::Released), true, &[]);
        assert_eq!(
            step(&Known::default(), &followed, 3, &released),
            Step::Write
        );
    }

    #[test]
    fn done_when_the_status_already_says_it() {
        let p = plan(None, false, &[]);
        let current = held(3);
        let round = Round {
            current: &current,
            newest_grant: 3,
            plan: &p,
            unchanged: true,
            now_ms: NOW_MS,
        };
        assert_eq!(next_step(&Known::default(), &round), Step::Done);
        assert_eq!(
            next_step(
                &Known::default(),
                &Round {
                    unchanged: false,
                    ..round
                }
            ),
            Step::Write
        );
    }
}
