//! Who holds a lease next, and why the current holder stops holding it: plain functions over
//! plain data, so every rule here is unit-tested without a cluster. The reconciler gathers a
//! [`LeaseView`] and [`ClaimView`]s, calls [`decide`], and writes the [`Plan`].

use std::time::Instant;

use crate::api::ClaimPhase;

use super::token::next_token;

/// A claim as the decision needs it.
#[derive(Clone, Debug, PartialEq)]
pub struct ClaimView {
    pub name: String,
    pub uid: String,
    /// Creation time (whole seconds, as the API stores it) for FIFO order.
    pub created: i64,
    /// Has a deletion timestamp: the candidate is releasing it.
    pub deleting: bool,
    pub pod: PodPresence,
    pub phase: Option<ClaimPhase>,
    /// When the operator will consider this claim's heartbeat stopped, were it the holder.
    pub heartbeat_deadline: Instant,
}

/// Whether the pod a claim names exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodPresence {
    /// The claim names no pod.
    NotNamed,
    Present,
    Missing,
}

/// The lease as the decision needs it.
#[derive(Clone, Debug, PartialEq)]
pub struct LeaseView {
    /// UID of the holding claim, as the lease status says.
    pub holder_uid: Option<String>,
    /// `status.fencingToken`: the last token issued for this lease object.
    pub last_token: i64,
    /// The last token issued under this name before the lease was deleted and re-created.
    pub high_water_mark: i64,
    pub min_token: i64,
    /// Has a deletion timestamp: holders are revoked and no one is granted.
    pub deleting: bool,
}

/// Why a holder stopped holding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndReason {
    /// Its heartbeat did not change for the lease duration.
    Expired,
    /// Its claim was deleted (or is being deleted): a release.
    Released,
    /// The pod it names is gone.
    PodDeleted,
    /// The lease itself is being deleted.
    LeaseDeleted,
}

impl EndReason {
    /// The phase the (surviving) claim takes, if any.
    pub fn claim_phase(self) -> ClaimPhase {
        match self {
            EndReason::Expired => ClaimPhase::Expired,
            EndReason::Released | EndReason::PodDeleted | EndReason::LeaseDeleted => {
                ClaimPhase::Revoked
            }
        }
    }
}

/// The holder that stops holding in this step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ended {
    pub uid: String,
    pub reason: EndReason,
}

/// A grant to make: one status write of the lease, guarded by its resourceVersion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub claim: String,
    pub uid: String,
    pub token: i64,
}

/// What to do with a lease now.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The current holder stops holding.
    pub ended: Option<Ended>,
    /// A new holder is granted.
    pub grant: Option<Grant>,
    /// UID of the holder after this step (the kept one, or the newly granted one).
    pub holder_uid: Option<String>,
    /// Claims eligible for the lease, in grant order (the holder excluded): position = index+1.
    pub queue: Vec<String>,
    /// A claim is waiting but no token is left to issue.
    pub tokens_exhausted: bool,
    /// Decide again at this instant (the holder's heartbeat deadline).
    pub wake_at: Option<Instant>,
}

/// Can this claim be granted the lease?
fn eligible(claim: &ClaimView) -> bool {
    // A claim whose status says Granted but that the lease does not name lost the lease at
    // some point (a restart between our writes, say): like Expired and Revoked, it is done.
    !claim.deleting
        && claim.pod != PodPresence::Missing
        && matches!(claim.phase, None | Some(ClaimPhase::Pending))
}

/// Grant order: oldest claim first; ties (the API keeps whole seconds) broken by name.
pub fn fifo_order(claims: &[ClaimView]) -> Vec<&ClaimView> {
    let mut waiting: Vec<&ClaimView> = claims.iter().filter(|c| eligible(c)).collect();
    waiting.sort_by(|a, b| a.created.cmp(&b.created).then_with(|| a.name.cmp(&b.name)));
    waiting
}

/// Why the current holder must stop now, if it must.
fn holder_verdict(
    lease: &LeaseView,
    holder: Option<&ClaimView>,
    now: Instant,
) -> Option<EndReason> {
    let Some(holder) = holder else {
        return Some(EndReason::Released); // the claim is gone
    };
    if holder.deleting {
        Some(EndReason::Released)
    } else if holder.pod == PodPresence::Missing {
        Some(EndReason::PodDeleted)
    } else if lease.deleting {
        Some(EndReason::LeaseDeleted)
    } else if now >= holder.heartbeat_deadline {
        Some(EndReason::Expired)
    } else {
        None
    }
}

/// Decides one step for one lease: end the holder if it must end, grant the next claim if
/// the lease is free. Tokens only come from [`next_token`] over the larger of the lease's
/// last token and its high-water mark, so they grow per lease name, never repeat (I1).
pub fn decide(lease: &LeaseView, claims: &[ClaimView], now: Instant) -> Plan {
    let mut plan = Plan {
        ended: None,
        grant: None,
        holder_uid: None,
        queue: Vec::new(),
        tokens_exhausted: false,
        wake_at: None,
    };

    if let Some(uid) = &lease.holder_uid {
        let holder = claims.iter().find(|c| &c.uid == uid);
        match holder_verdict(lease, holder, now) {
            Some(reason) => {
                plan.ended = Some(Ended {
                    uid: uid.clone(),
                    reason,
                })
            }
            None => {
                plan.holder_uid = Some(uid.clone());
                plan.wake_at = holder.map(|h| h.heartbeat_deadline);
            }
        }
    }

    let holder = plan.holder_uid.clone();
    let ended = plan.ended.as_ref().map(|e| e.uid.clone());
    let mut waiting = fifo_order(claims)
        .into_iter()
        .filter(|c| Some(&c.uid) != holder.as_ref() && Some(&c.uid) != ended.as_ref());

    if plan.holder_uid.is_none() && !lease.deleting {
        if let Some(next) = waiting.next() {
            match next_token(lease.last_token.max(lease.high_water_mark), lease.min_token) {
                Some(token) => {
                    plan.grant = Some(Grant {
                        claim: next.name.clone(),
                        uid: next.uid.clone(),
                        token,
                    });
                    plan.holder_uid = Some(next.uid.clone());
                    // Checked again once the grant is written and the heartbeat clock reset.
                    plan.wake_at = None;
                }
                None => {
                    plan.tokens_exhausted = true;
                    plan.queue.push(next.name.clone());
                }
            }
        }
    }
    plan.queue.extend(waiting.map(|c| c.name.clone()));
    plan
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn claim(name: &str, created: i64, deadline: Instant) -> ClaimView {
        ClaimView {
            name: name.into(),
            uid: format!("uid-{name}"),
            created,
            deleting: false,
            pod: PodPresence::NotNamed,
            phase: Some(ClaimPhase::Pending),
            heartbeat_deadline: deadline,
        }
    }

    fn free_lease() -> LeaseView {
        LeaseView {
            holder_uid: None,
            last_token: 0,
            high_water_mark: 0,
            min_token: 0,
            deleting: false,
        }
    }

    fn held_by(uid: &str, token: i64) -> LeaseView {
        LeaseView {
            holder_uid: Some(uid.into()),
            last_token: token,
            ..free_lease()
        }
    }

    #[test]
    fn oldest_pending_claim_is_granted_token_one() {
        let now = Instant::now();
        let later = now + Duration::from_secs(15);
        let claims = [
            claim("b", 20, later),
            claim("a", 10, later),
            claim("c", 20, later),
        ];
        let plan = decide(&free_lease(), &claims, now);
        assert_eq!(
            plan.grant,
            Some(Grant {
                claim: "a".into(),
                uid: "uid-a".into(),
                token: 1
            })
        );
        assert_eq!(plan.queue, ["b", "c"], "same second: by name");
    }

    #[test]
    fn live_holder_keeps_the_lease_and_wakes_at_its_deadline() {
        let now = Instant::now();
        let deadline = now + Duration::from_secs(15);
        let claims = [claim("a", 1, deadline), claim("b", 2, deadline)];
        let plan = decide(&held_by("uid-a", 4), &claims, now);
        assert_eq!(plan.ended, None);
        assert_eq!(plan.grant, None);
        assert_eq!(plan.wake_at, Some(deadline));
        assert_eq!(plan.queue, ["b"]);
    }

    #[test]
    fn silent_holder_expires_at_its_deadline_not_before() {
        let now = Instant::now();
        let deadline = now + Duration::from_secs(15);
        let claims = [claim("a", 1, deadline), claim("b", 2, deadline)];
        let before = decide(
            &held_by("uid-a", 4),
            &claims,
            deadline - Duration::from_millis(1),
        );
        assert_eq!(before.ended, None);
        let at = decide(&held_by("uid-a", 4), &claims, deadline);
        assert_eq!(
            at.ended,
            Some(Ended {
                uid: "uid-a".into(),
                reason: EndReason::Expired
            })
        );
        assert_eq!(
            at.grant,
            Some(Grant {
                claim: "b".into(),
                uid: "uid-b".into(),
                token: 5
            })
        );
    }

    #[test]
    fn deleted_claim_releases_and_next_is_granted_at_once() {
        let now = Instant::now();
        let later = now + Duration::from_secs(15);
        let claims = [claim("b", 2, later)];
        let plan = decide(&held_by("uid-a", 1), &claims, now);
        assert_eq!(plan.ended.map(|e| e.reason), Some(EndReason::Released));
        assert_eq!(plan.grant.map(|g| g.token), Some(2));
    }

    #[test]
    fn deleting_holder_claim_and_missing_pod_end_the_hold() {
        let now = Instant::now();
        let later = now + Duration::from_secs(15);
        let mut a = claim("a", 1, later);
        a.deleting = true;
        assert_eq!(
            decide(&held_by("uid-a", 1), &[a.clone()], now)
                .ended
                .map(|e| e.reason),
            Some(EndReason::Released)
        );
        a.deleting = false;
        a.pod = PodPresence::Missing;
        assert_eq!(
            decide(&held_by("uid-a", 1), &[a], now)
                .ended
                .map(|e| e.reason),
            Some(EndReason::PodDeleted)
        );
    }

    #[test]
    fn claims_that_cannot_hold_are_skipped() {
        let now = Instant::now();
        let later = now + Duration::from_secs(15);
        let mut gone_pod = claim("a", 1, later);
        gone_pod.pod = PodPresence::Missing;
        let mut expired = claim("b", 2, later);
        expired.phase = Some(ClaimPhase::Expired);
        let mut deleting = claim("c", 3, later);
        deleting.deleting = true;
        let ok = claim("d", 4, later);
        let plan = decide(&free_lease(), &[gone_pod, expired, deleting, ok], now);
        assert_eq!(plan.grant.map(|g| g.claim), Some("d".into()));
    }

    #[test]
    fn min_token_and_high_water_mark_are_floors() {
        let now = Instant::now();
        let claims = [claim("a", 1, now + Duration::from_secs(1))];
        let lease = LeaseView {
            min_token: 100,
            ..free_lease()
        };
        assert_eq!(
            decide(&lease, &claims, now).grant.map(|g| g.token),
            Some(101)
        );
        let lease = LeaseView {
            high_water_mark: 41,
            ..free_lease()
        };
        assert_eq!(
            decide(&lease, &claims, now).grant.map(|g| g.token),
            Some(42)
        );
    }

    #[test]
    fn deleting_lease_revokes_and_grants_no_one() {
        let now = Instant::now();
        let later = now + Duration::from_secs(15);
        let claims = [claim("a", 1, later), claim("b", 2, later)];
        let lease = LeaseView {
            deleting: true,
            ..held_by("uid-a", 3)
        };
        let plan = decide(&lease, &claims, now);
        assert_eq!(plan.ended.map(|e| e.reason), Some(EndReason::LeaseDeleted));
        assert_eq!(plan.grant, None);
    }

    #[test]
    fn exhausted_tokens_stop_grants() {
        let now = Instant::now();
        let claims = [claim("a", 1, now + Duration::from_secs(1))];
        let lease = LeaseView {
            last_token: i64::MAX,
            ..free_lease()
        };
        let plan = decide(&lease, &claims, now);
        assert_eq!(plan.grant, None);
        assert!(plan.tokens_exhausted);
    }

    #[test]
    fn a_granted_claim_the_lease_does_not_name_does_not_queue_again() {
        let now = Instant::now();
        let later = now + Duration::from_secs(15);
        let mut stale = claim("a", 1, later);
        stale.phase = Some(ClaimPhase::Granted);
        let plan = decide(&free_lease(), &[stale, claim("b", 2, later)], now);
        assert_eq!(plan.grant.map(|g| g.claim), Some("b".into()));
    }
}
