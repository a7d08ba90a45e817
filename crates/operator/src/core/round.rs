//! One round of deciding a lease's status: who holds next, from its claims ([`decide`]) or
//! from the coordination Lease it follows ([`decide_follow`]), above the token record once it
//! has been read, and the status that decision implies ([`status::lease_status`]). The
//! reconciler gathers what a round rests on (the caches, and what it has read from the API in
//! their place) into a [`RoundView`], calls [`decide_round`], and carries out the step
//! [`next_step`](super::step::next_step) names; after each read, it decides again.

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::jiff::Timestamp;

use crate::core::decide::{ClaimView, LeaseView, Plan, decide};
use crate::core::follow::{FollowView, Followed, decide_follow};
use crate::core::status::{self, Term};
use crate::core::token::TokenFloor;
use crate::state::CachedClaim;
use fenced_lease_api::{FencedLease, FencedLeaseStatus};

/// What one round decides on.
#[derive(Clone, Copy, Debug)]
pub struct RoundView<'a> {
    /// The lease as last read (from the cache or the API).
    pub lease: &'a FencedLease,
    /// Its claims (the cache's, with those read from the API in place of their cached copies).
    pub claims: &'a [Arc<CachedClaim>],
    /// The views of `claims`, each pod's presence judged against the pod the holder was
    /// granted to.
    pub views: &'a [ClaimView],
    /// For a lease that follows a coordination Lease (`spec.follow`): that Lease, as read from
    /// the API or else as cached; absent, it counts as missing.
    pub followed: Option<&'a Followed>,
    /// The token record of the lease's name, once read.
    pub record: Option<i64>,
    /// Why the lease's fence is not in force, if it is not: no one is granted then (I12).
    pub unfenced: Option<&'a str>,
}

/// One round's decision.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// The status decided from: the lease's as last read.
    pub current: FencedLeaseStatus,
    pub plan: Plan,
    /// The status the plan implies; equal to `current` when nothing is to change.
    pub desired: FencedLeaseStatus,
}

/// Decides one round at `now` (the wall clock: `wall`). `pod_uid` gives the UID of the pod a
/// claim belongs to; it is asked only of the claim granted, whose term is bound to that pod
/// (I5).
pub fn decide_round(
    view: &RoundView,
    pod_uid: impl FnOnce(&CachedClaim) -> Option<String>,
    now: Instant,
    wall: Timestamp,
) -> Decision {
    let lease = view.lease;
    let current = lease.status.clone().unwrap_or_default();
    let plan = match &lease.spec.follow {
        Some(follow) => {
            let followed = view.followed.unwrap_or(&Followed::Missing);
            let (record, unfenced) = (view.record, view.unfenced);
            decide_followed(
                lease,
                &follow.lease,
                followed,
                &current,
                unfenced,
                record,
                wall,
            )
        }
        None => {
            let (record, unfenced) = (view.record, view.unfenced);
            decide_claims(lease, &current, view.views, unfenced, record, now, wall)
        }
    };
    let granted = plan.grant.as_ref().and_then(|g| {
        view.claims
            .iter()
            .find(|c| c.metadata.uid.as_deref() == Some(&g.uid))
    });
    let term = Term {
        duration_seconds: lease.spec.lease_duration_seconds,
        pod_uid: granted.and_then(|c| pod_uid(c)),
    };
    let refs: Vec<&CachedClaim> = view.claims.iter().map(|c| c.as_ref()).collect();
    let generation = lease.metadata.generation;
    let desired = status::lease_status(&current, &plan, &refs, &term, generation, wall);
    Decision {
        current,
        plan,
        desired,
    }
}

/// The claims' decision ([`decide`]): who of them holds next, with a token above the token
/// record `record` once it has been read.
pub fn decide_claims(
    lease: &FencedLease,
    current: &FencedLeaseStatus,
    views: &[ClaimView],
    unfenced: Option<&str>,
    record: Option<i64>,
    now: Instant,
    wall: Timestamp,
) -> Plan {
    let view = LeaseView {
        holder_uid: current.holder.as_ref().map(|h| h.claim_uid.clone()),
        last_token: current.fencing_token,
        high_water_mark: record.unwrap_or(0),
        min_token: lease.spec.min_token,
        deleting: lease.metadata.deletion_timestamp.is_some(),
        unfenced: unfenced.map(String::from),
        term: lease.term(),
        duration: lease.spec.lease_duration(),
    };
    decide(&view, views, now, wall.as_millisecond())
}

/// The decision of a lease that follows the coordination Lease named `name`
/// ([`decide_follow`]), as `followed` shows it, with a token above the token record `record`
/// once it has been read.
pub fn decide_followed(
    lease: &FencedLease,
    name: &str,
    followed: &Followed,
    current: &FencedLeaseStatus,
    unfenced: Option<&str>,
    record: Option<i64>,
    wall: Timestamp,
) -> Plan {
    decide_follow(&FollowView {
        lease: name,
        followed,
        current: current.holder.as_ref(),
        deleting: lease.metadata.deletion_timestamp.is_some(),
        unfenced,
        floor: TokenFloor {
            last_issued: current.fencing_token,
            recorded: record.unwrap_or(0),
            min_token: lease.spec.min_token,
            now_ms: wall.as_millisecond(),
        },
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

    use super::*;
    use crate::core::decide::{EndReason, Grant, PodPresence};
    use crate::core::status::tests::claim;
    use fenced_lease_api::{ClaimPhase, FollowedTerm, LeaseHolder};

    const NOW_MS: i64 = 1_764_500_000_000;

    fn wall() -> Timestamp {
        Timestamp::from_millisecond(NOW_MS).expect("a time")
    }

    /// Lease `l` with `spec` (JSON, defaults filled in) and `status`.
    fn lease(spec: serde_json::Value, status: Option<FencedLeaseStatus>) -> FencedLease {
        let mut lease = FencedLease::new("l", serde_json::from_value(spec).expect("a spec"));
        lease.metadata.generation = Some(1);
        lease.status = status;
        lease
    }

    /// Claims of lease `l` (name, creation second, phase), heartbeats seen at `now`, and
    /// their views.
    fn claims(
        of: &[(&str, i64, ClaimPhase)],
        now: Instant,
    ) -> (Vec<Arc<CachedClaim>>, Vec<ClaimView>) {
        of.iter()
            .map(|(name, created, phase)| {
                let view = ClaimView {
                    name: name.to_string(),
                    uid: format!("uid-{name}"),
                    created: *created,
                    deleting: false,
                    pod: PodPresence::NotNamed,
                    phase: Some(*phase),
                    last_beat: now,
                };
                (Arc::new(claim(name, Some(*phase))), view)
            })
            .unzip()
    }

    fn view<'a>(
        lease: &'a FencedLease,
        (claims, views): &'a (Vec<Arc<CachedClaim>>, Vec<ClaimView>),
    ) -> RoundView<'a> {
        RoundView {
            lease,
            claims,
            views,
            followed: None,
            record: None,
            unfenced: None,
        }
    }

    /// Claim `name` as the holder a status names.
    fn holder(name: &str) -> LeaseHolder {
        LeaseHolder {
            claim: name.into(),
            claim_uid: format!("uid-{name}"),
            identity: format!("id-{name}"),
            ..Default::default()
        }
    }

    #[test]
    fn a_free_lease_goes_to_its_oldest_claim_with_a_token_above_the_record() {
        let now = Instant::now();
        let lease = lease(json!({"leaseDurationSeconds": 30}), None);
        let claims = claims(
            &[("b", 2, ClaimPhase::Pending), ("a", 1, ClaimPhase::Pending)],
            now,
        );
        let mut asked = Vec::new();
        let pod_uid = |c: &CachedClaim| {
            asked.push(c.name_any());
            Some(format!("pod-of-{}", c.name_any()))
        };
        let round = RoundView {
            record: Some(NOW_MS + 5000),
            ..view(&lease, &claims)
        };
        let d = decide_round(&round, pod_uid, now, wall());
        let token = NOW_MS + 5001;
        assert_eq!(
            d.plan.grant,
            Some(Grant {
                claim: "a".into(),
                uid: "uid-a".into(),
                token
            })
        );
        assert_eq!(asked, ["a"], "only the claim granted is asked for its pod");
        let held = d.desired.holder.as_ref().expect("a holder");
        assert_eq!((held.claim.as_str(), held.identity.as_str()), ("a", "id-a"));
        assert_eq!(held.pod_uid.as_deref(), Some("pod-of-a"));
        assert_eq!(d.desired.fencing_token, token);
        assert_eq!(d.desired.lease_duration_seconds, Some(30));
        assert_eq!(d.desired.waiting, 1, "b waits");
        assert_eq!(d.current, FencedLeaseStatus::default());
    }

    #[test]
    fn a_decided_status_decided_on_again_changes_nothing() {
        let now = Instant::now();
        let free = lease(json!({}), None);
        let pending = claims(&[("a", 1, ClaimPhase::Pending)], now);
        let granted = decide_round(&view(&free, &pending), |_| None, now, wall());

        let held = lease(json!({}), Some(granted.desired.clone()));
        let holding = claims(&[("a", 1, ClaimPhase::Granted)], now);
        let later = Timestamp::from_millisecond(NOW_MS + 1000).expect("a time");
        let again = decide_round(&view(&held, &holding), |_| None, now, later);
        assert_eq!(again.plan.grant, None);
        assert_eq!(again.plan.ended, None);
        assert_eq!(again.plan.holder_uid.as_deref(), Some("uid-a"));
        assert_eq!(again.desired, again.current, "nothing to write");
    }

    #[test]
    fn a_silent_holder_is_to_be_expired_before_anyone_else_is_granted() {
        let now = Instant::now();
        let status = FencedLeaseStatus {
            holder: Some(holder("a")),
            fencing_token: 7,
            lease_duration_seconds: Some(10),
            ..Default::default()
        };
        let lease = lease(json!({"leaseDurationSeconds": 10}), Some(status));
        let mut claims = claims(
            &[("a", 1, ClaimPhase::Granted), ("b", 2, ClaimPhase::Pending)],
            now,
        );
        claims.1[0].last_beat = now - Duration::from_secs(11);
        let d = decide_round(&view(&lease, &claims), |_| None, now, wall());
        assert_eq!(d.plan.expire, ["uid-a"]);
        assert_eq!(d.plan.ended.map(|e| e.reason), Some(EndReason::Expired));
    }

    #[test]
    fn an_unfenced_lease_grants_no_one_and_says_why() {
        let now = Instant::now();
        let lease = lease(json!({}), None);
        let claims = claims(&[("a", 1, ClaimPhase::Pending)], now);
        let round = RoundView {
            unfenced: Some("no slot for kind Deployment"),
            ..view(&lease, &claims)
        };
        let d = decide_round(&round, |_| None, now, wall());
        assert_eq!(d.plan.grant, None);
        assert_eq!(d.desired.holder, None);
        assert_eq!(d.desired.fencing_token, 0);
        let held = d.desired.conditions.iter().find(|c| c.type_ == "Held");
        let held = held.expect("a Held condition");
        assert_eq!(
            (held.status.as_str(), held.reason.as_str()),
            ("False", "FenceNotInForce")
        );
        assert!(held.message.contains("no slot for kind Deployment"));
    }

    #[test]
    fn a_deleted_lease_revokes_its_holder_grants_no_one_and_keeps_its_token() {
        let now = Instant::now();
        let status = FencedLeaseStatus {
            holder: Some(holder("a")),
            fencing_token: 7,
            ..Default::default()
        };
        let mut lease = lease(json!({}), Some(status));
        lease.metadata.deletion_timestamp = Some(Time(wall()));
        let claims = claims(
            &[("a", 1, ClaimPhase::Granted), ("b", 2, ClaimPhase::Pending)],
            now,
        );
        let d = decide_round(&view(&lease, &claims), |_| None, now, wall());
        assert_eq!(
            d.plan.ended.map(|e| e.reason),
            Some(EndReason::LeaseDeleted)
        );
        assert_eq!(d.plan.grant, None);
        assert_eq!(d.desired.holder, None);
        assert_eq!(d.desired.fencing_token, 7);
    }

    #[test]
    fn a_following_lease_is_held_by_the_pod_its_lease_names_never_by_a_claim() {
        let now = Instant::now();
        let lease = lease(json!({"follow": {"lease": "ctrl"}}), None);
        let claims = claims(&[("a", 1, ClaimPhase::Pending)], now);
        let followed = Followed::Lease {
            term: FollowedTerm {
                name: "ctrl".into(),
                uid: "uid-ctrl".into(),
                lease_transitions: 3,
            },
            identity: Some("pod-x_1b2c".into()),
            pod: Some(("pod-x".into(), "uid-x".into())),
            sought: vec!["pod-x".into()],
        };
        let round = RoundView {
            followed: Some(&followed),
            record: Some(NOW_MS + 9),
            ..view(&lease, &claims)
        };
        let d = decide_round(&round, |_| panic!("no claim is granted"), now, wall());
        let held = d.desired.holder.as_ref().expect("a holder");
        assert_eq!(held.claim, "");
        assert_eq!(held.identity, "pod-x_1b2c");
        assert_eq!(
            (held.pod_name.as_deref(), held.pod_uid.as_deref()),
            (Some("pod-x"), Some("uid-x"))
        );
        assert_eq!(d.desired.fencing_token, NOW_MS + 10, "above the record");
        assert_eq!(d.desired.lease_duration_seconds, None);
    }

    #[test]
    fn a_following_lease_whose_lease_is_not_seen_is_held_by_no_one() {
        let now = Instant::now();
        let lease = lease(json!({"follow": {"lease": "ctrl"}}), None);
        let claims = claims(&[("a", 1, ClaimPhase::Pending)], now);
        let d = decide_round(&view(&lease, &claims), |_| None, now, wall());
        assert_eq!(d.plan.grant, None);
        assert_eq!(d.desired.holder, None);
    }
}
