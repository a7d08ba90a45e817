//! The status the operator wants on a lease after a [`Plan`] (its claims':
//! [`claim_status`](super::claim_status)): pure functions, so "repair from the lease status" is
//! the same code as "write a grant".

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, Time};
use k8s_openapi::jiff::Timestamp;

use crate::state::claim::CachedClaim;
use fenced_lease_api::{FencedLeaseStatus, LeaseHolder};

use crate::core::decide::Plan;
use crate::core::follow;

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
    if let Some(grant) = &plan.grant {
        let followed = plan.follows.as_ref().and_then(|f| f.holder.clone());
        next.lease_duration_seconds = followed.is_none().then_some(term.duration_seconds);
        next.holder = Some(followed.unwrap_or_else(|| {
            let claim = claims
                .iter()
                .find(|c| c.metadata.uid.as_deref() == Some(grant.uid.as_str()));
            LeaseHolder {
                claim: grant.claim.clone(),
                claim_uid: grant.uid.clone(),
                identity: claim
                    .map(|c| c.spec.holder_identity.clone())
                    .unwrap_or_default(),
                pod_name: claim.and_then(|c| c.spec.pod_name.clone()),
                pod_uid: term.pod_uid.clone(),
                lease: None,
            }
        }));
        next.fencing_token = grant.token;
        next.acquire_time = Some(MicroTime(now));
        next.lease_transitions += 1;
    }
    next.waiting = i32::try_from(plan.queue.len()).unwrap_or(i32::MAX);
    next.observed_generation = generation;

    let (status, reason, message) = held(&next, plan);
    let conditions = &mut next.conditions;
    set_condition(
        conditions, "Held", status, reason, &message, generation, now,
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

/// The `Held` condition's status, reason and message for a lease status after `plan`.
fn held(status: &FencedLeaseStatus, plan: &Plan) -> (&'static str, &'static str, String) {
    match (&status.holder, plan.tokens_exhausted, &plan.unfenced) {
        (Some(h), _, _) if h.lease.is_some() => (
            "True",
            "Held",
            format!(
                "held by {} (pod {}), the holder of Lease {}, with token {}",
                h.identity,
                h.pod_name.as_deref().unwrap_or_default(),
                h.lease.as_ref().map_or("", |l| l.name.as_str()),
                status.fencing_token
            ),
        ),
        (Some(h), _, _) => (
            "True",
            "Held",
            format!("held by {} with token {}", h.identity, status.fencing_token),
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
pub(crate) mod tests {
    use super::*;
    use crate::core::claim_status::claim_status;
    use crate::core::decide::{EndReason, Ended, Grant, PodPresence};
    use fenced_lease_api::{
        ClaimPhase, FencedLeaseClaim, FencedLeaseClaimSpec, FencedLeaseClaimStatus,
    };

    /// Claim `name` of lease `l`, in `phase`, naming no pod.
    pub(crate) fn claim(name: &str, phase: Option<ClaimPhase>) -> CachedClaim {
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
            ..Plan::default()
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
            ..Plan::default()
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
}
