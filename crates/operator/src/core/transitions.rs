//! What the operator reports of a lease changing hands: for each transition a decision made,
//! the metric it counts, the log line, and the Event on the lease (naming the claim).

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::EventType;
use prometheus_client::encoding::EncodeLabelValue;

use crate::core::decide::{EndReason, Plan};
use crate::names::claim_reference;
use fenced_lease_api::{
    ClaimPhase, FencedLeaseClaimStatus, FencedLeaseSpec, FencedLeaseStatus, LeaseHolder,
};

/// A change of hands, as counted by `fenced_lease_transitions_total`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum Transition {
    Granted,
    Expired,
    Released,
    Revoked,
}

/// One thing to report about a lease.
#[derive(Clone, Debug, PartialEq)]
pub struct Notice {
    /// Counted, when it is a change of hands.
    pub transition: Option<Transition>,
    pub type_: EventType,
    pub reason: &'static str,
    pub action: &'static str,
    pub note: String,
    /// The claim it concerns, named on the Event.
    pub claim: Option<ObjectReference>,
    /// The token concerned (0 when none).
    pub token: i64,
}

/// What to report of `plan` carried out on lease `ns/name`: its holder ending (as the status
/// `before` named it), a grant (to the holder `after` names), tokens running out.
pub fn notices(
    ns: &str,
    before: &FencedLeaseStatus,
    after: &FencedLeaseStatus,
    spec: &FencedLeaseSpec,
    plan: &Plan,
) -> Vec<Notice> {
    let mut notices = Vec::new();
    let followed = plan.follows.as_ref().map_or("", |f| f.lease.as_str());
    if let (Some(ended), Some(holder)) = (&plan.ended, &before.holder) {
        notices.push(ended_notice(
            ns,
            before,
            spec,
            ended.reason,
            holder,
            followed,
        ));
    }
    if let Some(grant) = &plan.grant {
        let holder = after.holder.clone().unwrap_or_default();
        let mut note = format!("granted token {} to {}", grant.token, who(&holder));
        if holder.lease.is_some() {
            note.push_str(&format!(", the holder of Lease {followed}"));
        }
        notices.push(Notice {
            transition: Some(Transition::Granted),
            type_: EventType::Normal,
            reason: "Granted",
            action: "Grant",
            note,
            claim: claim_of(ns, &holder),
            token: grant.token,
        });
    }
    if let Some(note) = newly_without_pod(before, after) {
        notices.push(Notice {
            transition: None,
            type_: EventType::Warning,
            reason: "HolderPodNotFound",
            action: "Grant",
            note,
            claim: None,
            token: 0,
        });
    }
    if plan.tokens_exhausted {
        notices.push(Notice {
            transition: None,
            type_: EventType::Warning,
            reason: "TokensExhausted",
            action: "Grant",
            note: "no fencing token is left to issue: the token space is exhausted".into(),
            claim: None,
            token: 0,
        });
    }
    notices
}

/// The notice of `holder`'s term ending for `why`, as status `before` named it; `followed`:
/// the coordination Lease the lease follows, if any.
fn ended_notice(
    ns: &str,
    before: &FencedLeaseStatus,
    spec: &FencedLeaseSpec,
    why: EndReason,
    holder: &LeaseHolder,
    followed: &str,
) -> Notice {
    let who = who(holder);
    let token = before.fencing_token;
    let (reason, transition, note) = match why {
        EndReason::Expired => (
            "Expired",
            Transition::Expired,
            format!(
                "{who} expired with token {token}: no heartbeat for {}s",
                before.term_seconds(spec)
            ),
        ),
        EndReason::Released => (
            "Released",
            Transition::Released,
            format!("{who} released token {token}"),
        ),
        EndReason::PodDeleted => revoked(&who, token, "its pod was deleted"),
        EndReason::LeaseDeleted => revoked(&who, token, "the lease is being deleted"),
        EndReason::Revoked => revoked(&who, token, "its claim was revoked"),
        EndReason::Followed if holder.lease.is_none() => {
            revoked(&who, token, "the lease follows a coordination Lease now")
        }
        EndReason::Followed => {
            revoked(&who, token, &format!("Lease {followed} no longer names it"))
        }
    };
    Notice {
        transition: Some(transition),
        type_: EventType::Normal,
        reason,
        action: "Hand-over",
        note,
        claim: claim_of(ns, holder),
        token,
    }
}

/// What a claim's status said before it is written again.
#[derive(Clone, Copy, Debug, Default)]
pub struct ClaimWas {
    pub phase: Option<ClaimPhase>,
    /// Its condition `PodFound` was `False`.
    pub pod_missing: bool,
}

/// What to report on a claim of lease `ns/lease` whose status goes from `was` to `desired`
/// (`pod` is the pod it names): losing the lease, its pod found missing. A grant is told once,
/// by the lease's Event naming the claim (an Event is an apiserver write: one per grant, not
/// two). Only the Event fields are set: the lease's notices count the transitions.
pub fn claim_notices(
    was: ClaimWas,
    desired: &FencedLeaseClaimStatus,
    ns: &str,
    lease: &str,
    pod: Option<&str>,
) -> Vec<Notice> {
    let mut notices = Vec::new();
    let phase = was.phase;
    let notice = |type_, reason, action, note| Notice {
        transition: None,
        type_,
        reason,
        action,
        note,
        claim: None,
        token: desired.fencing_token.unwrap_or_default(),
    };
    match desired.phase {
        became if became == phase => {}
        Some(became @ (ClaimPhase::Expired | ClaimPhase::Revoked)) => {
            let reason = if became == ClaimPhase::Expired {
                "Expired"
            } else {
                "Revoked"
            };
            let note = desired.message.clone().unwrap_or_default();
            notices.push(notice(EventType::Warning, reason, "Hand-over", note));
        }
        _ => {}
    }
    let pod_missing = desired
        .conditions
        .iter()
        .any(|c| c.type_ == "PodFound" && c.status == "False");
    if pod_missing && !was.pod_missing {
        let pod = pod.unwrap_or_default();
        let note = format!(
            "pod {pod} does not exist in namespace {ns}; the claim cannot hold lease {lease} until it does"
        );
        notices.push(notice(EventType::Warning, "PodNotFound", "Grant", note));
    }
    notices
}

/// A holder as the Events name it: its identity, and its claim (or, holding a followed
/// Lease, its pod).
fn who(holder: &LeaseHolder) -> String {
    match (&holder.lease, holder.pod_name.as_deref()) {
        (Some(_), Some(pod)) => format!("{} (pod {pod})", holder.identity),
        _ => format!("{} (claim {})", holder.identity, holder.claim),
    }
}

/// The claim an Event about `holder` names, if a claim holds.
fn claim_of(ns: &str, holder: &LeaseHolder) -> Option<ObjectReference> {
    (!holder.claim.is_empty()).then(|| claim_reference(ns, &holder.claim, &holder.claim_uid))
}

/// The `Held` condition's message when it newly says the followed Lease's holder names no pod
/// (or names another identity that does not), for a Warning Event: once per identity, not
/// once per reconcile.
fn newly_without_pod(before: &FencedLeaseStatus, after: &FencedLeaseStatus) -> Option<String> {
    let held = |s: &FencedLeaseStatus| {
        s.conditions
            .iter()
            .find(|c| c.type_ == "Held" && c.reason == "HolderPodNotFound")
            .map(|c| c.message.clone())
    };
    let now = held(after)?;
    (held(before).as_ref() != Some(&now)).then_some(now)
}

fn revoked(who: &str, token: i64, why: &str) -> (&'static str, Transition, String) {
    (
        "Revoked",
        Transition::Revoked,
        format!("{who} lost token {token}: {why}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::decide::{Ended, Grant};

    fn holder(claim: &str, identity: &str) -> LeaseHolder {
        LeaseHolder {
            claim: claim.into(),
            claim_uid: format!("uid-{claim}"),
            identity: identity.into(),
            ..Default::default()
        }
    }

    fn spec() -> FencedLeaseSpec {
        serde_json::from_value(serde_json::json!({"leaseDurationSeconds": 10})).expect("spec")
    }

    fn status(token: i64, holder_of: Option<LeaseHolder>) -> FencedLeaseStatus {
        FencedLeaseStatus {
            fencing_token: token,
            holder: holder_of,
            lease_duration_seconds: Some(7),
            ..Default::default()
        }
    }

    fn plan(ended: Option<EndReason>, grant: Option<(&str, i64)>) -> Plan {
        Plan {
            ended: ended.map(|reason| Ended {
                uid: "uid-a".into(),
                reason,
            }),
            grant: grant.map(|(claim, token)| Grant {
                claim: claim.into(),
                uid: format!("uid-{claim}"),
                token,
            }),
            ..Plan::default()
        }
    }

    #[test]
    fn an_expiry_then_a_grant_are_two_transitions_in_that_order() {
        let before = status(4, Some(holder("a", "pod-a")));
        let after = status(5, Some(holder("b", "pod-b")));
        let n = notices(
            "ns",
            &before,
            &after,
            &spec(),
            &plan(Some(EndReason::Expired), Some(("b", 5))),
        );
        let said: Vec<_> = n
            .iter()
            .map(|n| (n.transition, n.reason, n.token))
            .collect();
        assert_eq!(
            said,
            [
                (Some(Transition::Expired), "Expired", 4),
                (Some(Transition::Granted), "Granted", 5)
            ]
        );
        // The term the holder was granted, not the spec's.
        assert_eq!(
            n[0].note,
            "pod-a (claim a) expired with token 4: no heartbeat for 7s"
        );
        assert_eq!(n[1].note, "granted token 5 to pod-b (claim b)");
        assert_eq!(n[1].claim.as_ref().unwrap().uid.as_deref(), Some("uid-b"));
    }

    #[test]
    fn each_end_says_why() {
        let before = status(4, Some(holder("a", "pod-a")));
        for (reason, says, why) in [
            (EndReason::Released, "Released", "released token 4"),
            (EndReason::PodDeleted, "Revoked", "its pod was deleted"),
            (
                EndReason::LeaseDeleted,
                "Revoked",
                "the lease is being deleted",
            ),
            (EndReason::Revoked, "Revoked", "its claim was revoked"),
        ] {
            let n = notices("ns", &before, &before, &spec(), &plan(Some(reason), None));
            assert_eq!(n.len(), 1);
            assert_eq!(n[0].reason, says);
            assert!(n[0].note.contains(why), "{}", n[0].note);
        }
    }

    #[test]
    fn nothing_to_say_without_a_holder_ending_or_a_grant() {
        let idle = status(4, None);
        // An end with no holder named before is not reported (nobody ended).
        assert!(
            notices(
                "ns",
                &idle,
                &idle,
                &spec(),
                &plan(Some(EndReason::Expired), None)
            )
            .is_empty()
        );
        let mut exhausted = plan(None, None);
        exhausted.tokens_exhausted = true;
        let n = notices("ns", &idle, &idle, &spec(), &exhausted);
        assert_eq!(
            (n.len(), n[0].type_, n[0].transition),
            (1, EventType::Warning, None)
        );
    }

    fn claim_status(phase: ClaimPhase, pod_found: Option<&str>) -> FencedLeaseClaimStatus {
        let mut s = FencedLeaseClaimStatus {
            phase: Some(phase),
            fencing_token: Some(9),
            message: Some("lost it".into()),
            ..Default::default()
        };
        if let Some(found) = pod_found {
            s.conditions.push(
                serde_json::from_value(serde_json::json!({
                    "type": "PodFound", "status": found, "reason": "R", "message": "",
                    "lastTransitionTime": "2026-12-01T00:00:00Z",
                }))
                .expect("condition"),
            );
        }
        s
    }

    #[test]
    fn a_claim_is_told_when_it_loses_or_its_pod_is_missing_once_each() {
        let pending = ClaimWas {
            phase: Some(ClaimPhase::Pending),
            pod_missing: false,
        };
        let said = |was, s: &FencedLeaseClaimStatus| {
            claim_notices(was, s, "ns", "db", Some("web-0"))
                .into_iter()
                .map(|n| (n.reason, n.note))
                .collect::<Vec<_>>()
        };
        // A grant is told on the lease (naming the claim), not again on the claim: one Event
        // per grant.
        let granted = claim_status(ClaimPhase::Granted, None);
        assert!(said(pending, &granted).is_empty());
        let holding = ClaimWas {
            phase: Some(ClaimPhase::Granted),
            ..pending
        };
        assert!(said(holding, &granted).is_empty());
        let expired = claim_status(ClaimPhase::Expired, None);
        assert_eq!(
            said(holding, &expired),
            [("Expired", "lost it".to_string())]
        );
        let revoked = claim_status(ClaimPhase::Revoked, None);
        assert_eq!(said(holding, &revoked)[0].0, "Revoked");
        // The pod found missing: said once, when the condition turns False.
        let waiting = claim_status(ClaimPhase::Pending, Some("False"));
        assert_eq!(
            said(pending, &waiting),
            [(
                "PodNotFound",
                "pod web-0 does not exist in namespace ns; the claim cannot hold lease db until it does"
                    .to_string()
            )]
        );
        let still = ClaimWas {
            pod_missing: true,
            ..pending
        };
        assert!(said(still, &waiting).is_empty());
    }
}
