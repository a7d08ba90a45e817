//! Who holds a lease next, and why the current holder stops holding it: plain functions over
//! plain data, so every rule here is unit-tested without a cluster. The reconciler gathers a
//! [`LeaseView`] and [`ClaimView`]s, calls [`decide`], and writes the [`Plan`].
//!
//! A heartbeat that stopped is never acted on directly: the plan lists the claims to
//! [`expire`](Plan::expire), the reconciler makes each final on the claim by a write
//! preconditioned on a version that shows the heartbeat last seen (I9), then decides again.
//! Only a plan with nothing left to expire is written.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use fenced_lease_api::{ClaimPhase, LeaseHolder};

use crate::core::token::{TokenFloor, next_token};

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
    /// When the operator last saw this claim's heartbeat change (its own monotonic clock).
    pub last_beat: Instant,
}

/// Whether the pod a claim names exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodPresence {
    /// The claim names no pod.
    NotNamed,
    Present,
    /// Gone, or replaced by another pod of the same name (another UID).
    Missing,
}

/// The lease as the decision needs it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LeaseView {
    /// UID of the holding claim, as the lease status says.
    pub holder_uid: Option<String>,
    /// `status.fencingToken`: the last token issued for this lease object.
    pub last_token: i64,
    /// The last token recorded for this name when a lease of that name was deleted.
    pub high_water_mark: i64,
    pub min_token: i64,
    /// Has a deletion timestamp: holders are revoked and no one is granted.
    pub deleting: bool,
    /// Why the fence the lease asks for is not in force, if it is not: no one is granted
    /// (I12: fail closed), while the holder keeps its term and expiries go on.
    pub unfenced: Option<String>,
    /// Duration of the running term (fixed at its grant, I10).
    pub term: Duration,
    /// `spec.leaseDurationSeconds`: the next term's duration, and how long a waiter may stay
    /// silent before it is skipped.
    pub duration: Duration,
}

/// Why a holder stopped holding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndReason {
    /// Its heartbeat did not change for the term's duration.
    Expired,
    /// Its claim was deleted (or is being deleted): a release.
    Released,
    /// The pod it names is gone.
    PodDeleted,
    /// The lease itself is being deleted.
    LeaseDeleted,
    /// Its claim already says `Revoked`.
    Revoked,
    /// The lease follows a coordination Lease (`spec.follow`), which names another holder or
    /// none, or it started following one.
    Followed,
}

impl EndReason {
    /// The phase the (surviving) claim takes, if any.
    pub fn claim_phase(self) -> ClaimPhase {
        match self {
            EndReason::Expired => ClaimPhase::Expired,
            EndReason::Released
            | EndReason::PodDeleted
            | EndReason::LeaseDeleted
            | EndReason::Revoked
            | EndReason::Followed => ClaimPhase::Revoked,
        }
    }
}

/// What the lease's holder is, as the followed Lease says (for the `Held` condition).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FollowState {
    /// The Lease does not exist.
    Missing,
    /// The Lease names no holder.
    Free,
    /// The Lease's holder identity names no pod of the namespace: these were sought.
    NoPod {
        identity: String,
        sought: Vec<String>,
    },
    /// The Lease's holder is a pod.
    Held,
}

/// A following lease's decision, carried by its [`Plan`] (see [`crate::core::follow`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Follow {
    /// The followed Lease's name.
    pub lease: String,
    pub state: FollowState,
    /// The holder to name in the status when the plan grants.
    pub holder: Option<LeaseHolder>,
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
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// The current holder stops holding.
    pub ended: Option<Ended>,
    /// A new holder is granted.
    pub grant: Option<Grant>,
    /// UID of the holder after this step (the kept one, or the newly granted one).
    pub holder_uid: Option<String>,
    /// Claims eligible for the lease, in grant order (the holder excluded): position = index+1.
    pub queue: Vec<String>,
    /// Claims whose heartbeat stopped (the holder, or waiters ahead of the next grant): each
    /// must be confirmed silent (a write preconditioned on the version last seen) and made
    /// `Expired` before this plan may be written. The reconciler does that, then decides again.
    pub expire: Vec<String>,
    /// A claim is waiting but no token is left to issue.
    pub tokens_exhausted: bool,
    /// A claim is waiting but the lease's fence is not in force: why.
    pub unfenced: Option<String>,
    /// Decide again at this instant (the holder's heartbeat deadline).
    pub wake_at: Option<Instant>,
    /// Claim name -> index in `queue` (filled by [`decide`]).
    pub positions: HashMap<String, usize>,
    /// For a lease that follows a coordination Lease: what it follows and who holds it (see
    /// [`crate::core::follow`]); claims are never granted then.
    pub follows: Option<Follow>,
}

impl Plan {
    /// Index of claim `name` in the queue (0 = next), without a scan of the queue.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.positions.get(name).copied()
    }
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
    } else if holder.phase == Some(ClaimPhase::Expired) {
        Some(EndReason::Expired)
    } else if holder.phase == Some(ClaimPhase::Revoked) {
        Some(EndReason::Revoked)
    } else if holder.pod == PodPresence::Missing {
        Some(EndReason::PodDeleted)
    } else if lease.deleting {
        Some(EndReason::LeaseDeleted)
    } else if now >= holder.last_beat + lease.term {
        Some(EndReason::Expired)
    } else {
        None
    }
}

/// Decides one step for one lease: end the holder if it must end, grant the next claim if
/// the lease is free. `now_ms` is the wall clock (ms since the Unix epoch), a floor of the
/// next token (see [`crate::core::token`]). Tokens only come from [`next_token`] over the lease's
/// last token and recorded high-water mark, so they grow per lease name, never repeat (I1).
pub fn decide(lease: &LeaseView, claims: &[ClaimView], now: Instant, now_ms: i64) -> Plan {
    let mut plan = Plan::default();

    if let Some(uid) = &lease.holder_uid {
        let holder = claims.iter().find(|c| &c.uid == uid);
        match holder_verdict(lease, holder, now) {
            Some(reason) => {
                let silent = reason == EndReason::Expired
                    && holder.is_some_and(|h| h.phase != Some(ClaimPhase::Expired));
                if silent {
                    plan.expire.push(uid.clone());
                }
                plan.ended = Some(Ended {
                    uid: uid.clone(),
                    reason,
                })
            }
            None => {
                plan.holder_uid = Some(uid.clone());
                plan.wake_at = holder.map(|h| h.last_beat + lease.term);
            }
        }
    }

    let holder = plan.holder_uid.clone();
    let ended = plan.ended.as_ref().map(|e| e.uid.clone());
    let mut waiting = fifo_order(claims)
        .into_iter()
        .filter(|c| Some(&c.uid) != holder.as_ref() && Some(&c.uid) != ended.as_ref())
        .peekable();

    if plan.holder_uid.is_none() && !lease.deleting {
        // Waiters that fell silent for a whole duration (a candidate that died) are skipped,
        // so they do not cost everyone behind them a term.
        while let Some(next) = waiting.next_if(|c| now >= c.last_beat + lease.duration) {
            plan.expire.push(next.uid.clone());
        }
        if let Some(cause) = &lease.unfenced {
            plan.unfenced = waiting.peek().map(|_| cause.clone());
        } else if let Some(next) = waiting.next() {
            let floor = TokenFloor {
                last_issued: lease.last_token,
                recorded: lease.high_water_mark,
                min_token: lease.min_token,
                now_ms,
            };
            match next_token(floor) {
                Some(token) => {
                    plan.grant = Some(Grant {
                        claim: next.name.clone(),
                        uid: next.uid.clone(),
                        token,
                    });
                    plan.holder_uid = Some(next.uid.clone());
                    plan.wake_at = Some(next.last_beat + lease.duration);
                }
                None => {
                    plan.tokens_exhausted = true;
                    plan.queue.push(next.name.clone());
                }
            }
        }
    }
    plan.queue.extend(waiting.map(|c| c.name.clone()));
    plan.positions = plan
        .queue
        .iter()
        .enumerate()
        .map(|(i, name)| (name.clone(), i))
        .collect();
    plan
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const D: Duration = Duration::from_secs(15);
    const NOW_MS: i64 = 1_764_500_000_000;

    /// A claim whose heartbeat was last seen changing at `beat`.
    fn claim(name: &str, created: i64, beat: Instant) -> ClaimView {
        ClaimView {
            name: name.into(),
            uid: format!("uid-{name}"),
            created,
            deleting: false,
            pod: PodPresence::NotNamed,
            phase: Some(ClaimPhase::Pending),
            last_beat: beat,
        }
    }

    fn free_lease() -> LeaseView {
        LeaseView {
            term: D,
            duration: D,
            ..LeaseView::default()
        }
    }

    fn held_by(uid: &str, token: i64) -> LeaseView {
        LeaseView {
            holder_uid: Some(uid.into()),
            last_token: token,
            ..free_lease()
        }
    }

    fn granted(name: &str, created: i64, beat: Instant) -> ClaimView {
        ClaimView {
            phase: Some(ClaimPhase::Granted),
            ..claim(name, created, beat)
        }
    }

    #[test]
    fn oldest_pending_claim_is_granted_a_token_at_least_the_wall_clock() {
        let now = Instant::now();
        let claims = [
            claim("b", 20, now),
            claim("a", 10, now),
            claim("c", 20, now),
        ];
        let plan = decide(&free_lease(), &claims, now, NOW_MS);
        assert_eq!(
            plan.grant,
            Some(Grant {
                claim: "a".into(),
                uid: "uid-a".into(),
                token: NOW_MS
            })
        );
        assert_eq!(plan.queue, ["b", "c"], "same second: by name");
        assert!(plan.expire.is_empty());
    }

    #[test]
    fn live_holder_keeps_the_lease_and_wakes_at_its_deadline() {
        let now = Instant::now();
        let claims = [granted("a", 1, now), claim("b", 2, now)];
        let plan = decide(&held_by("uid-a", 4), &claims, now, NOW_MS);
        assert_eq!(plan.ended, None);
        assert_eq!(plan.grant, None);
        assert_eq!(plan.wake_at, Some(now + D));
        assert_eq!(plan.queue, ["b"]);
    }

    #[test]
    fn a_silent_holder_is_to_be_expired_at_its_deadline_not_before() {
        let beat = Instant::now();
        let claims = [granted("a", 1, beat), claim("b", 2, beat + D)];
        let lease = held_by("uid-a", 4);
        let before = decide(&lease, &claims, beat + D - Duration::from_millis(1), NOW_MS);
        assert_eq!(before.ended, None);
        assert!(before.expire.is_empty());
        let at = decide(&lease, &claims, beat + D, NOW_MS);
        assert_eq!(
            at.ended,
            Some(Ended {
                uid: "uid-a".into(),
                reason: EndReason::Expired
            })
        );
        assert_eq!(
            at.expire,
            ["uid-a"],
            "confirmed on the claim before any grant"
        );
        assert_eq!(
            at.grant.map(|g| (g.claim, g.token)),
            Some(("b".into(), NOW_MS))
        );
    }

    #[test]
    fn once_the_claim_says_expired_the_grant_needs_no_more_confirmation() {
        let beat = Instant::now();
        let mut a = granted("a", 1, beat);
        a.phase = Some(ClaimPhase::Expired);
        let claims = [a, claim("b", 2, beat + D)];
        let plan = decide(&held_by("uid-a", 4), &claims, beat + D, NOW_MS);
        assert_eq!(plan.ended.map(|e| e.reason), Some(EndReason::Expired));
        assert!(plan.expire.is_empty());
        assert_eq!(plan.grant.map(|g| g.claim), Some("b".into()));
    }

    #[test]
    fn the_running_term_not_the_spec_decides_expiry() {
        let beat = Instant::now();
        let claims = [granted("a", 1, beat)];
        let lease = LeaseView {
            term: Duration::from_secs(3600),
            duration: Duration::from_secs(10),
            ..held_by("uid-a", 4)
        };
        let later = decide(&lease, &claims, beat + Duration::from_secs(11), NOW_MS);
        assert_eq!(later.ended, None, "lowering the spec does not cut the term");
        assert_eq!(later.wake_at, Some(beat + Duration::from_secs(3600)));
    }

    #[test]
    fn a_silent_waiter_is_skipped_and_to_be_expired() {
        let t0 = Instant::now();
        let dead = claim("a", 1, t0);
        let live = claim("b", 2, t0 + D);
        let plan = decide(&free_lease(), &[dead, live], t0 + D, NOW_MS);
        assert_eq!(plan.expire, ["uid-a"]);
        assert_eq!(plan.grant.map(|g| g.claim), Some("b".into()));
    }

    #[test]
    fn deleted_claim_releases_and_next_is_granted_at_once() {
        let now = Instant::now();
        let claims = [claim("b", 2, now)];
        let plan = decide(&held_by("uid-a", NOW_MS - 5), &claims, now, NOW_MS);
        assert_eq!(plan.ended.map(|e| e.reason), Some(EndReason::Released));
        assert_eq!(plan.grant.map(|g| g.token), Some(NOW_MS));
    }

    #[test]
    fn deleting_holder_claim_and_missing_pod_end_the_hold() {
        let now = Instant::now();
        let mut a = granted("a", 1, now);
        a.deleting = true;
        assert_eq!(
            decide(&held_by("uid-a", 1), &[a.clone()], now, NOW_MS)
                .ended
                .map(|e| e.reason),
            Some(EndReason::Released)
        );
        a.deleting = false;
        a.pod = PodPresence::Missing;
        assert_eq!(
            decide(&held_by("uid-a", 1), &[a], now, NOW_MS)
                .ended
                .map(|e| e.reason),
            Some(EndReason::PodDeleted)
        );
    }

    #[test]
    fn claims_that_cannot_hold_are_skipped() {
        let now = Instant::now();
        let mut gone_pod = claim("a", 1, now);
        gone_pod.pod = PodPresence::Missing;
        let mut expired = claim("b", 2, now);
        expired.phase = Some(ClaimPhase::Expired);
        let mut deleting = claim("c", 3, now);
        deleting.deleting = true;
        let ok = claim("d", 4, now);
        let plan = decide(
            &free_lease(),
            &[gone_pod, expired, deleting, ok],
            now,
            NOW_MS,
        );
        assert_eq!(plan.grant.map(|g| g.claim), Some("d".into()));
    }

    #[test]
    fn min_token_and_high_water_mark_are_floors() {
        let now = Instant::now();
        let claims = [claim("a", 1, now)];
        let lease = LeaseView {
            min_token: NOW_MS * 2,
            ..free_lease()
        };
        assert_eq!(
            decide(&lease, &claims, now, NOW_MS).grant.map(|g| g.token),
            Some(NOW_MS * 2 + 1)
        );
        let lease = LeaseView {
            high_water_mark: NOW_MS + 41,
            ..free_lease()
        };
        assert_eq!(
            decide(&lease, &claims, now, NOW_MS).grant.map(|g| g.token),
            Some(NOW_MS + 42)
        );
    }

    #[test]
    fn deleting_lease_revokes_and_grants_no_one() {
        let now = Instant::now();
        let claims = [granted("a", 1, now), claim("b", 2, now)];
        let lease = LeaseView {
            deleting: true,
            ..held_by("uid-a", 3)
        };
        let plan = decide(&lease, &claims, now, NOW_MS);
        assert_eq!(plan.ended.map(|e| e.reason), Some(EndReason::LeaseDeleted));
        assert_eq!(plan.grant, None);
    }

    #[test]
    fn a_lease_whose_fence_is_not_in_force_grants_no_one_but_still_expires_its_holder() {
        let now = Instant::now();
        let unfenced = |lease: LeaseView| LeaseView {
            unfenced: Some("policy refused".into()),
            ..lease
        };
        let plan = decide(&unfenced(free_lease()), &[claim("a", 1, now)], now, NOW_MS);
        assert_eq!(plan.grant, None);
        assert_eq!(plan.unfenced.as_deref(), Some("policy refused"));
        assert_eq!(plan.queue, ["a"], "the claim waits, first in line");

        let plan = decide(&unfenced(free_lease()), &[], now, NOW_MS);
        assert_eq!(plan.unfenced, None, "nothing waits: nothing held up");

        let silent = now - D - Duration::from_secs(1);
        let claims = [granted("a", 1, silent), claim("b", 2, now)];
        let plan = decide(&unfenced(held_by("uid-a", 3)), &claims, now, NOW_MS);
        assert_eq!(plan.ended.map(|e| e.reason), Some(EndReason::Expired));
        assert_eq!(plan.grant, None);

        let claims = [granted("a", 1, now), claim("b", 2, now)];
        let plan = decide(&unfenced(held_by("uid-a", 3)), &claims, now, NOW_MS);
        assert_eq!(
            plan.holder_uid.as_deref(),
            Some("uid-a"),
            "the term runs on"
        );
    }

    #[test]
    fn exhausted_tokens_stop_grants() {
        let now = Instant::now();
        let claims = [claim("a", 1, now)];
        let lease = LeaseView {
            last_token: i64::MAX,
            ..free_lease()
        };
        let plan = decide(&lease, &claims, now, NOW_MS);
        assert_eq!(plan.grant, None);
        assert!(plan.tokens_exhausted);
    }

    #[test]
    fn a_granted_claim_the_lease_does_not_name_does_not_queue_again() {
        let now = Instant::now();
        let stale = granted("a", 1, now);
        let plan = decide(&free_lease(), &[stale, claim("b", 2, now)], now, NOW_MS);
        assert_eq!(plan.grant.map(|g| g.claim), Some("b".into()));
    }
}
