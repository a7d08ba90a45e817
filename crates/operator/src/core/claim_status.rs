//! The status the operator wants on each claim of a lease after a [`Plan`], on a claim whose
//! lease does not exist, and on one whose heartbeat stopped: pure functions, one rule per
//! status, so "repair from the lease status" is the same code as "write a grant".

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;

use crate::core::decide::{EndReason, Plan, PodPresence};
use crate::core::status::set_condition;
use crate::state::claim::CachedClaim;
use fenced_lease_api::{ClaimPhase, FencedLeaseClaimStatus, FencedLeaseStatus};

/// The generation a claim status records: none. Every heartbeat changes the claim's spec
/// (`renewTime`), so recording the generation would cost an operator write per heartbeat; a
/// heartbeat must cost one write, the holder's own.
pub const CLAIM_GENERATION: Option<i64> = None;

/// Queue positions shown on the first claims of a queue only: every hand-over moves every
/// position, and a lease with thousands of waiters must not cost thousands of claim writes
/// per hand-over. Claims further back say so in their message.
pub const POSITIONS_SHOWN: usize = 100;

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
    let (holder, ended) = standing(uid, lease, plan);
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

/// The statuses of one lease's claims after a plan, as [`claim_status`] gives them, each
/// returned only where it differs from the claim's. The claims waiting further back than the
/// positions shown all get one status but for their conditions' times: it is built once (with
/// and without a pod), not once per claim, so a hand-over costs the same however long the
/// queue behind the positions shown.
pub struct ClaimStatuses<'a> {
    lease_name: &'a str,
    lease: &'a FencedLeaseStatus,
    plan: &'a Plan,
    now: Timestamp,
    /// The status of a claim far back, naming no pod and naming one, once built.
    far_back: [Option<FencedLeaseClaimStatus>; 2],
}

impl<'a> ClaimStatuses<'a> {
    pub fn new(
        lease_name: &'a str,
        lease: &'a FencedLeaseStatus,
        plan: &'a Plan,
        now: Timestamp,
    ) -> Self {
        ClaimStatuses {
            lease_name,
            lease,
            plan,
            now,
            far_back: [None, None],
        }
    }

    /// The status `claim` should have, or `None` when it has it already.
    pub fn change(
        &mut self,
        claim: &CachedClaim,
        pod: PodPresence,
    ) -> Option<FencedLeaseClaimStatus> {
        let (name, lease, plan, now) = (self.lease_name, self.lease, self.plan, self.now);
        if let Some(names_pod) = self.far_back_of(claim, pod) {
            let shared = self.far_back[usize::from(names_pod)]
                .get_or_insert_with(|| claim_status(claim, name, lease, plan, pod, now));
            if claim
                .status
                .as_ref()
                .is_some_and(|s| s.same_but_times(shared))
            {
                return None;
            }
        }
        let desired = claim_status(claim, name, lease, plan, pod, now);
        let same = claim.status.as_ref().is_some_and(|s| *s == desired);
        (!same).then_some(desired)
    }

    /// For a claim [`claim_status`] gives the status of every claim waiting further back than
    /// the positions shown (all that it reads of the claim besides its conditions is whether
    /// it names a pod): `Pending`, neither the holder nor the holder that ends, its pod there
    /// if it names one. Whether it names a pod; `None` for any other claim.
    fn far_back_of(&self, claim: &CachedClaim, pod: PodPresence) -> Option<bool> {
        let uid = claim.metadata.uid.as_deref()?;
        let position = claim
            .metadata
            .name
            .as_deref()
            .and_then(|n| self.plan.position(n))?;
        let pending = claim.status.as_ref()?.phase == Some(ClaimPhase::Pending);
        let (holder, ended) = standing(uid, self.lease, self.plan);
        let back = pending && !holder && ended.is_none() && position >= POSITIONS_SHOWN;
        (back && pod != PodPresence::Missing).then_some(claim.spec.pod_name.is_some())
    }
}

/// Whether claim `uid` holds the lease after the plan, and why its hold ends, if the plan
/// ends it.
fn standing(uid: &str, lease: &FencedLeaseStatus, plan: &Plan) -> (bool, Option<EndReason>) {
    let holder = lease.holder.as_ref().is_some_and(|h| h.claim_uid == uid);
    let ended = plan.ended.as_ref().filter(|e| e.uid == uid);
    (holder, ended.map(|e| e.reason))
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

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::core::decide::Ended;
    use crate::core::status::tests::claim;

    #[test]
    fn waiting_claim_shows_its_position_and_a_missing_pod() {
        let mut b = claim("b", None);
        let p = Plan {
            queue: vec!["a".into(), "b".into()],
            positions: [("a".to_string(), 0), ("b".to_string(), 1)].into(),
            follows: None,
            wake_at: Some(Instant::now()),
            ..Plan::default()
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
            &Plan::default(),
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
            &Plan::default(),
            PodPresence::NotNamed,
            Timestamp::UNIX_EPOCH,
        );
        assert_eq!(cs.phase, Some(ClaimPhase::Revoked));
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

    /// A plan whose queue has `ahead` claims before `name`.
    fn queued(name: &str, ahead: usize) -> Plan {
        let mut queue: Vec<String> = (0..ahead).map(|i| format!("w-{i}")).collect();
        queue.push(name.into());
        let positions = queue
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), i))
            .collect();
        Plan {
            holder_uid: Some("uid-holder".into()),
            queue,
            positions,
            ..Plan::default()
        }
    }

    /// Claim `name` waiting, naming `pod`, with the status the operator wrote at `at` seconds.
    fn answered(
        name: &str,
        pod: Option<&str>,
        plan: &Plan,
        presence: PodPresence,
        at: u64,
    ) -> CachedClaim {
        let mut c = claim(name, Some(ClaimPhase::Pending));
        c.spec.pod_name = pod.map(Into::into);
        let at = Timestamp::UNIX_EPOCH + std::time::Duration::from_secs(at);
        let status = claim_status(&c, "l", &FencedLeaseStatus::default(), plan, presence, at);
        c.status = Some(status.into());
        c
    }

    fn later<'a>(lease: &'a FencedLeaseStatus, plan: &'a Plan) -> ClaimStatuses<'a> {
        ClaimStatuses::new(
            "l",
            lease,
            plan,
            Timestamp::UNIX_EPOCH + std::time::Duration::from_secs(3600),
        )
    }

    #[test]
    fn claims_far_back_that_say_so_need_no_write_whoever_built_the_status() {
        let lease = FencedLeaseStatus::default();
        for (pod, presence) in [
            (None, PodPresence::NotNamed),
            (Some("p"), PodPresence::Present),
        ] {
            let plan = queued("c", POSITIONS_SHOWN + 5);
            let mut plan2 = plan.clone();
            plan2.queue.push("d".into());
            plan2.positions.insert("d".into(), POSITIONS_SHOWN + 6);
            // Answered at different times: their conditions' times differ.
            let c = answered("c", pod, &plan, presence, 0);
            let d = answered("d", pod, &plan2, presence, 60);
            let mut statuses = later(&lease, &plan2);
            assert_eq!(statuses.change(&c, presence), None, "pod {pod:?}");
            assert_eq!(statuses.change(&d, presence), None, "pod {pod:?}");
            // One with a condition of another type besides is compared whole: no write either.
            let mut e = answered("c", pod, &plan, presence, 0);
            let mut extra = e.status.clone().unwrap();
            let mut conditions = extra.conditions.to_vec();
            conditions.push(conditions[0].clone());
            conditions.last_mut().unwrap().type_ = "Other".into();
            extra.conditions = conditions.into();
            e.status = Some(extra);
            assert_eq!(statuses.change(&e, presence), None, "pod {pod:?}");
            // One far back whose status says something else is written, the shared status
            // built already.
            let mut stale = answered("d", pod, &plan2, presence, 0);
            stale.status.as_mut().unwrap().message = Some("waiting for lease l".into());
            let status = statuses.change(&stale, presence);
            assert_eq!(status.and_then(|s| s.message), Some(beyond_shown("l")));
        }
    }

    #[test]
    fn any_other_claim_gets_the_status_claim_status_gives_it() {
        let lease = FencedLeaseStatus::default();
        let far = queued("c", POSITIONS_SHOWN + 5);
        let c = answered("c", None, &far, PodPresence::NotNamed, 0);

        // Moved into the positions shown.
        let near = queued("c", 3);
        let status = later(&lease, &near).change(&c, PodPresence::NotNamed);
        assert_eq!(status.and_then(|s| s.queue_position), Some(4));

        // Its pod went missing; and back.
        let p = answered("c", Some("p"), &far, PodPresence::Present, 0);
        let status = later(&lease, &far)
            .change(&p, PodPresence::Missing)
            .unwrap();
        assert_eq!(
            status.message.as_deref(),
            Some("waiting for pod p to exist")
        );
        let gone = answered("c", Some("p"), &far, PodPresence::Missing, 0);
        let status = later(&lease, &far)
            .change(&gone, PodPresence::Present)
            .unwrap();
        assert_eq!(status.message.as_deref(), Some(beyond_shown("l").as_str()));

        // Never answered; told of another lease.
        let fresh = claim("c", None);
        assert!(
            later(&lease, &far)
                .change(&fresh, PodPresence::NotNamed)
                .is_some()
        );
        let status = ClaimStatuses::new("m", &lease, &far, Timestamp::UNIX_EPOCH)
            .change(&c, PodPresence::NotNamed);
        assert_eq!(status.and_then(|s| s.message), Some(beyond_shown("m")));

        // The holder that ends, and the holder.
        let ending = Plan {
            ended: Some(Ended {
                uid: "uid-c".into(),
                reason: EndReason::Expired,
            }),
            ..far.clone()
        };
        let status = later(&lease, &ending).change(&c, PodPresence::NotNamed);
        assert_eq!(status.and_then(|s| s.phase), Some(ClaimPhase::Expired));
        let held = FencedLeaseStatus {
            holder: Some(fenced_lease_api::LeaseHolder {
                claim: "c".into(),
                claim_uid: "uid-c".into(),
                ..Default::default()
            }),
            fencing_token: 9,
            ..Default::default()
        };
        let status = later(&held, &far).change(&c, PodPresence::NotNamed);
        assert_eq!(status.and_then(|s| s.fencing_token), Some(9));
    }
}
