//! The status the operator wants on a lease and on each of its claims after a [`Plan`]:
//! pure functions, so "repair from the lease status" is the same code as "write a grant".

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, Time};
use k8s_openapi::jiff::Timestamp;

use crate::api::{ClaimPhase, FencedLeaseClaimStatus, FencedLeaseStatus, LeaseHolder};
use crate::operator::state::claim::CachedClaim;

use crate::operator::core::decide::{EndReason, Plan, PodPresence};
use crate::operator::core::follow;

/// The generation a claim status records: none. Every heartbeat changes the claim's spec
/// (`renewTime`), so recording the generation would cost an operator write per heartbeat; a
/// heartbeat must cost one write, the holder's own.
pub const CLAIM_GENERATION: Option<i64> = None;

/// Queue positions shown on the first claims of a queue only: every hand-over moves every
/// position, and a lease with thousands of waiters must not cost thousands of claim writes
/// per hand-over. Claims further back say so in their message.
pub const POSITIONS_SHOWN: usize = 100;

/// What a grant fixes for its whole term, besides the token.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Term {
    /// The term's duration: `spec.leaseDurationSeconds` at the grant (I10).
    pub duration_seconds: i32,
    /// UID of the new holder's pod, if it names one (I5).
    pub pod_uid: Option<String>,
}

/// The lease status after `plan`, from the current one. `claims` supplies the new holder's
/// identity and pod; `term` what the grant fixes.
pub fn lease_status(
    current: &FencedLeaseStatus,
    plan: &Plan,
    claims: &[&CachedClaim],
    term: &Term,
    generation: Option<i64>,
    now: Timestamp,
) -> FencedLeaseStatus {
    let mut next = current.clone();
    if plan.ended.is_some() {
        next.holder = None;
        next.acquire_time = None;
        next.lease_duration_seconds = None;
    }
    let followed = plan.follows.as_ref().and_then(|f| f.holder.clone());
    if let (Some(grant), Some(holder)) = (&plan.grant, followed) {
        next.holder = Some(holder);
        next.fencing_token = grant.token;
        next.lease_duration_seconds = None;
        next.acquire_time = Some(MicroTime(now));
        next.lease_transitions += 1;
    } else if let Some(grant) = &plan.grant {
        let claim = claims
            .iter()
            .find(|c| c.metadata.uid.as_deref() == Some(grant.uid.as_str()));
        next.holder = Some(LeaseHolder {
            claim: grant.claim.clone(),
            claim_uid: grant.uid.clone(),
            identity: claim
                .map(|c| c.spec.holder_identity.clone())
                .unwrap_or_default(),
            pod_name: claim.and_then(|c| c.spec.pod_name.clone()),
            pod_uid: term.pod_uid.clone(),
            lease: None,
        });
        next.fencing_token = grant.token;
        next.lease_duration_seconds = Some(term.duration_seconds);
        next.acquire_time = Some(MicroTime(now));
        next.lease_transitions += 1;
    }
    next.waiting = i32::try_from(plan.queue.len()).unwrap_or(i32::MAX);
    next.observed_generation = generation;

    let held = match (&next.holder, plan.tokens_exhausted, &plan.unfenced) {
        (Some(h), _, _) if h.lease.is_some() => (
            "True",
            "Held",
            format!(
                "held by {} (pod {}), the holder of Lease {}, with token {}",
                h.identity,
                h.pod_name.as_deref().unwrap_or_default(),
                h.lease.as_ref().map_or("", |l| l.name.as_str()),
                next.fencing_token
            ),
        ),
        (Some(h), _, _) => (
            "True",
            "Held",
            format!("held by {} with token {}", h.identity, next.fencing_token),
        ),
        (None, _, Some(cause)) => ("False", "FenceNotInForce", cause.clone()),
        (None, true, None) => (
            "False",
            "TokensExhausted",
            "no token is left to issue; see spec.minToken".to_string(),
        ),
        (None, false, None) => match &plan.follows {
            Some(follow) => follow::not_held(follow),
            None => ("False", "Free", "no claim is waiting".to_string()),
        },
    };
    set_condition(
        &mut next.conditions,
        "Held",
        held.0,
        held.1,
        &held.2,
        generation,
        now,
    );
    if next
        .conditions
        .iter()
        .any(|c| c.type_ == "Degraded" && c.status == "True")
    {
        set_condition(
            &mut next.conditions,
            "Degraded",
            "False",
            "Recovered",
            "",
            generation,
            now,
        );
    }
    next
}

/// What the claim's status should say, given the lease status after the plan.
pub fn claim_status(
    claim: &CachedClaim,
    lease_name: &str,
    lease: &FencedLeaseStatus,
    plan: &Plan,
    pod: PodPresence,
    now: Timestamp,
) -> FencedLeaseClaimStatus {
    let uid = claim.metadata.uid.as_deref().unwrap_or_default();
    let current = claim.full_status();
    let mut next = FencedLeaseClaimStatus {
        observed_generation: CLAIM_GENERATION,
        conditions: current.conditions.clone(),
        ..Default::default()
    };
    let holder = lease.holder.as_ref().is_some_and(|h| h.claim_uid == uid);
    let ended = plan
        .ended
        .as_ref()
        .filter(|e| e.uid == uid)
        .map(|e| e.reason);

    if holder {
        next.phase = Some(ClaimPhase::Granted);
        next.fencing_token = Some(lease.fencing_token);
        next.grant_time = match (current.fencing_token, current.grant_time) {
            (Some(t), Some(time)) if t == lease.fencing_token => Some(time),
            _ => lease.acquire_time.clone(),
        };
        next.lease_duration_seconds = lease.lease_duration_seconds;
        next.message = Some(format!(
            "holds lease {lease_name} with fencing token {}",
            lease.fencing_token
        ));
    } else if let Some(reason) = ended {
        next.phase = Some(reason.claim_phase());
        keep_record(&mut next, &current);
        next.message = Some(ended_message(reason, lease_name));
    } else if matches!(
        current.phase,
        Some(ClaimPhase::Expired | ClaimPhase::Revoked)
    ) {
        return FencedLeaseClaimStatus {
            observed_generation: CLAIM_GENERATION,
            ..current
        };
    } else if current.phase == Some(ClaimPhase::Granted) {
        next.phase = Some(ClaimPhase::Revoked);
        keep_record(&mut next, &current);
        next.message = Some(format!(
            "no longer holds lease {lease_name}: the lease status names another holder"
        ));
    } else {
        next.phase = Some(ClaimPhase::Pending);
        (next.queue_position, next.message) = waiting(claim, lease_name, plan, pod);
    }

    found_conditions(&mut next.conditions, claim, pod, now);
    next
}

/// A claim that held the lease keeps the record of its hold: its token, grant time and term.
fn keep_record(next: &mut FencedLeaseClaimStatus, current: &FencedLeaseClaimStatus) {
    next.fencing_token = current.fencing_token;
    next.grant_time = current.grant_time.clone();
    next.lease_duration_seconds = current.lease_duration_seconds;
}

/// A waiting claim's queue position (shown for the first [`POSITIONS_SHOWN`]) and message.
fn waiting(
    claim: &CachedClaim,
    lease_name: &str,
    plan: &Plan,
    pod: PodPresence,
) -> (Option<i32>, Option<String>) {
    let position = claim.metadata.name.as_ref().and_then(|n| plan.position(n));
    let shown = position.filter(|p| *p < POSITIONS_SHOWN);
    let queue_position = shown.map(|p| i32::try_from(p + 1).unwrap_or(i32::MAX));
    if let Some(follow) = &plan.follows {
        let message = format!(
            "lease {lease_name} follows Lease {} (coordination.k8s.io): its holder is that Lease's holder, and no claim is granted",
            follow.lease
        );
        return (None, Some(message));
    }
    let message = match (position, pod, &claim.spec.pod_name) {
        (_, PodPresence::Missing, Some(pod)) => format!("waiting for pod {pod} to exist"),
        (Some(p), _, _) if p < POSITIONS_SHOWN => format!(
            "waiting for lease {lease_name}: position {} in the queue",
            p + 1
        ),
        (Some(_), _, _) => beyond_shown(lease_name),
        (None, _, _) => format!("waiting for lease {lease_name}"),
    };
    (queue_position, Some(message))
}

/// The message of a claim waiting further back than the positions shown.
pub fn beyond_shown(lease_name: &str) -> String {
    format!("waiting for lease {lease_name}: more than {POSITIONS_SHOWN} claims ahead")
}

/// Conditions `LeaseFound` (true: the lease reconciler writes it) and, for a claim that names
/// a pod, `PodFound`.
fn found_conditions(
    conditions: &mut Vec<Condition>,
    claim: &CachedClaim,
    pod: PodPresence,
    now: Timestamp,
) {
    set_condition(
        conditions,
        "LeaseFound",
        "True",
        "Found",
        "",
        CLAIM_GENERATION,
        now,
    );
    if let Some(pod_name) = &claim.spec.pod_name {
        let (status, reason, message) = match pod {
            PodPresence::Missing => (
                "False",
                "PodNotFound",
                format!("pod {pod_name} does not exist"),
            ),
            _ => ("True", "Found", String::new()),
        };
        set_condition(
            conditions,
            "PodFound",
            status,
            reason,
            &message,
            CLAIM_GENERATION,
            now,
        );
    }
}

/// The status of a claim of lease `ns/lease`, which does not exist: a waiting claim waits
/// for it (and holds no token); one that held it is `Revoked`; a final one stays as it is.
/// Condition `LeaseFound` says so either way.
pub fn without_lease(
    current: &FencedLeaseClaimStatus,
    lease: &str,
    ns: &str,
    now: Timestamp,
) -> FencedLeaseClaimStatus {
    let waits =
        format!("FencedLease {lease} does not exist in namespace {ns}; the claim waits for it");
    let (phase, message) = match current.phase {
        Some(p @ (ClaimPhase::Expired | ClaimPhase::Revoked)) => {
            (p, current.message.clone().unwrap_or(waits))
        }
        Some(ClaimPhase::Granted) => (
            ClaimPhase::Revoked,
            format!("lost lease {lease}: FencedLease {lease} no longer exists in namespace {ns}"),
        ),
        _ => (ClaimPhase::Pending, waits),
    };
    let mut desired = FencedLeaseClaimStatus {
        phase: Some(phase),
        message: Some(message.clone()),
        conditions: current.conditions.clone(),
        observed_generation: CLAIM_GENERATION,
        ..Default::default()
    };
    if phase != ClaimPhase::Pending {
        keep_record(&mut desired, current);
    }
    set_condition(
        &mut desired.conditions,
        "LeaseFound",
        "False",
        "LeaseNotFound",
        &message,
        CLAIM_GENERATION,
        now,
    );
    desired
}

/// The status of a claim whose heartbeat stopped, confirmed: `Expired`, for good. A holder
/// keeps its token and grant time in the record; a waiter loses its place.
pub fn expired_status(
    current: FencedLeaseClaimStatus,
    lease_name: &str,
    holder: bool,
) -> FencedLeaseClaimStatus {
    let message = if holder {
        ended_message(EndReason::Expired, lease_name)
    } else {
        format!(
            "gave up waiting for lease {lease_name}: no heartbeat (spec.renewTime) seen for the lease duration; create a new claim to queue again"
        )
    };
    FencedLeaseClaimStatus {
        phase: Some(ClaimPhase::Expired),
        message: Some(message),
        queue_position: None,
        observed_generation: CLAIM_GENERATION,
        ..current
    }
}

fn ended_message(reason: EndReason, lease: &str) -> String {
    match reason {
        EndReason::Expired => {
            format!("lost lease {lease}: no heartbeat (spec.renewTime) seen for the lease duration")
        }
        EndReason::Released => format!("released lease {lease}"),
        EndReason::PodDeleted => format!("lost lease {lease}: its pod was deleted"),
        EndReason::LeaseDeleted => format!("lost lease {lease}: the lease was deleted"),
        EndReason::Revoked => format!("lost lease {lease}: the claim was revoked"),
        EndReason::Followed => {
            format!("lost lease {lease}: it follows a coordination Lease, whose holder holds it")
        }
    }
}

/// Sets condition `type_`, keeping its transition time when its status does not change.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: Timestamp,
) {
    let fresh = Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation: generation,
        last_transition_time: Time(now),
    };
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) if c.status == status => {
            c.reason = fresh.reason;
            c.message = fresh.message;
            c.observed_generation = generation;
        }
        Some(c) => *c = fresh,
        None => conditions.push(fresh),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::api::{FencedLeaseClaim, FencedLeaseClaimSpec};
    use crate::operator::core::decide::{Ended, Grant};

    fn claim(name: &str, phase: Option<ClaimPhase>) -> CachedClaim {
        let mut c = FencedLeaseClaim::new(
            name,
            FencedLeaseClaimSpec {
                lease_name: "l".into(),
                holder_identity: format!("id-{name}"),
                pod_name: None,
                renew_time: None,
            },
        );
        c.metadata.uid = Some(format!("uid-{name}"));
        c.status = phase.map(|p| FencedLeaseClaimStatus {
            phase: Some(p),
            ..Default::default()
        });
        c.into()
    }

    fn plan() -> Plan {
        Plan {
            ended: None,
            grant: None,
            holder_uid: None,
            queue: vec![],
            expire: vec![],
            tokens_exhausted: false,
            unfenced: None,
            wake_at: None,
            positions: Default::default(),
            follows: None,
        }
    }

    #[test]
    fn grant_sets_holder_token_and_transitions() {
        let a = claim("a", Some(ClaimPhase::Pending));
        let p = Plan {
            grant: Some(Grant {
                claim: "a".into(),
                uid: "uid-a".into(),
                token: 7,
            }),
            queue: vec!["b".into()],
            ..plan()
        };
        let s = lease_status(
            &FencedLeaseStatus {
                fencing_token: 6,
                ..Default::default()
            },
            &p,
            &[&a],
            &Term {
                duration_seconds: 30,
                pod_uid: None,
            },
            Some(1),
            Timestamp::UNIX_EPOCH,
        );
        assert_eq!(
            s.lease_duration_seconds,
            Some(30),
            "the term is fixed at the grant"
        );
        let holder = s.holder.as_ref().unwrap();
        assert_eq!(
            (
                holder.claim.as_str(),
                holder.identity.as_str(),
                s.fencing_token
            ),
            ("a", "id-a", 7)
        );
        assert_eq!((s.lease_transitions, s.waiting), (1, 1));
        assert_eq!(s.conditions[0].status, "True");

        let cs = claim_status(
            &a,
            "l",
            &s,
            &p,
            PodPresence::NotNamed,
            Timestamp::UNIX_EPOCH,
        );
        assert_eq!(
            (cs.phase, cs.fencing_token, cs.queue_position),
            (Some(ClaimPhase::Granted), Some(7), None)
        );
        assert_eq!(cs.lease_duration_seconds, Some(30));
    }

    #[test]
    fn ended_holder_keeps_its_token_and_says_why() {
        let a = claim("a", Some(ClaimPhase::Granted));
        let p = Plan {
            ended: Some(Ended {
                uid: "uid-a".into(),
                reason: EndReason::Expired,
            }),
            ..plan()
        };
        let s = lease_status(
            &FencedLeaseStatus {
                fencing_token: 3,
                ..Default::default()
            },
            &p,
            &[&a],
            &Term::default(),
            None,
            Timestamp::UNIX_EPOCH,
        );
        assert_eq!(
            (s.holder.clone(), s.fencing_token),
            (None, 3),
            "the token stays as the high-water mark"
        );
        let mut a = a;
        a.status.as_mut().unwrap().fencing_token = Some(3);
        let cs = claim_status(
            &a,
            "l",
            &s,
            &p,
            PodPresence::NotNamed,
            Timestamp::UNIX_EPOCH,
        );
        assert_eq!(
            (cs.phase, cs.fencing_token),
            (Some(ClaimPhase::Expired), Some(3))
        );
        assert!(cs.message.unwrap().contains("no heartbeat"));
    }

    #[test]
    fn waiting_claim_shows_its_position_and_a_missing_pod() {
        let mut b = claim("b", None);
        let p = Plan {
            queue: vec!["a".into(), "b".into()],
            positions: [("a".to_string(), 0), ("b".to_string(), 1)].into(),
            follows: None,
            wake_at: Some(Instant::now()),
            ..plan()
        };
        let cs = claim_status(
            &b,
            "l",
            &FencedLeaseStatus::default(),
            &p,
            PodPresence::NotNamed,
            Timestamp::UNIX_EPOCH,
        );
        assert_eq!(
            (cs.phase, cs.queue_position),
            (Some(ClaimPhase::Pending), Some(2))
        );

        b.spec.pod_name = Some("gone".into());
        let cs = claim_status(
            &b,
            "l",
            &FencedLeaseStatus::default(),
            &plan(),
            PodPresence::Missing,
            Timestamp::UNIX_EPOCH,
        );
        assert_eq!(cs.message.as_deref(), Some("waiting for pod gone to exist"));
        let pod_found = cs
            .conditions
            .iter()
            .find(|c| c.type_ == "PodFound")
            .unwrap();
        assert_eq!(
            (pod_found.status.as_str(), pod_found.reason.as_str()),
            ("False", "PodNotFound")
        );
    }

    #[test]
    fn a_granted_claim_the_lease_does_not_name_is_revoked() {
        let a = claim("a", Some(ClaimPhase::Granted));
        let cs = claim_status(
            &a,
            "l",
            &FencedLeaseStatus::default(),
            &plan(),
            PodPresence::NotNamed,
            Timestamp::UNIX_EPOCH,
        );
        assert_eq!(cs.phase, Some(ClaimPhase::Revoked));
    }

    #[test]
    fn condition_keeps_its_transition_time_while_status_holds() {
        let mut conditions = vec![];
        let t0 = Timestamp::UNIX_EPOCH;
        let t1 = Timestamp::from_second(60).unwrap();
        set_condition(&mut conditions, "Held", "True", "Held", "a", None, t0);
        set_condition(&mut conditions, "Held", "True", "Held", "b", None, t1);
        assert_eq!(
            (
                conditions[0].last_transition_time.0,
                conditions[0].message.as_str()
            ),
            (t0, "b")
        );
        set_condition(&mut conditions, "Held", "False", "Free", "", None, t1);
        assert_eq!(conditions[0].last_transition_time.0, t1);
    }

    #[test]
    fn a_claim_of_a_missing_lease_waits_without_a_token_or_loses_its_hold() {
        let now = Timestamp::now();
        let held = FencedLeaseClaimStatus {
            phase: Some(ClaimPhase::Granted),
            fencing_token: Some(7),
            grant_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                now,
            )),
            lease_duration_seconds: Some(10),
            ..Default::default()
        };
        let lost = without_lease(&held, "db", "ns", now);
        assert_eq!(
            (lost.phase, lost.fencing_token, lost.lease_duration_seconds),
            (Some(ClaimPhase::Revoked), Some(7), Some(10))
        );
        assert_eq!(
            lost.message.as_deref(),
            Some("lost lease db: FencedLease db no longer exists in namespace ns")
        );
        // A waiter waits, holding nothing; told so by its condition.
        let waiting = FencedLeaseClaimStatus {
            phase: Some(ClaimPhase::Pending),
            fencing_token: Some(3),
            ..Default::default()
        };
        let waits = without_lease(&waiting, "db", "ns", now);
        assert_eq!(
            (waits.phase, waits.fencing_token),
            (Some(ClaimPhase::Pending), None)
        );
        assert!(waits.conditions.iter().any(|c| c.type_ == "LeaseFound"
            && c.status == "False"
            && c.reason == "LeaseNotFound"));
        // A final phase stays, with its message.
        let expired = FencedLeaseClaimStatus {
            phase: Some(ClaimPhase::Expired),
            message: Some("expired".into()),
            fencing_token: Some(7),
            ..Default::default()
        };
        let still = without_lease(&expired, "db", "ns", now);
        assert_eq!(
            (still.phase, still.message.as_deref(), still.fencing_token),
            (Some(ClaimPhase::Expired), Some("expired"), Some(7))
        );
    }
}
