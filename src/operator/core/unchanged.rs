//! Which waiting claims keep their status, told without building it. After every hand-over the
//! lease's claims are brought in line with its status, and on a long queue most of them wait
//! further back than the positions shown: their status does not change, yet building and
//! comparing one for each was most of a hand-over's work. [`waits_unchanged`] says so from the
//! cached status alone; the tests hold it to [`claim_status`](super::status::claim_status).

use crate::api::ClaimPhase;
use crate::operator::core::decide::{Plan, PodPresence};
use crate::operator::core::status::{CLAIM_GENERATION, POSITIONS_SHOWN};
use crate::operator::state::claim::{CachedClaim, CachedClaimStatus};

/// Whether `claim`, neither the holder nor the holder that ends, already shows the status
/// [`claim_status`](super::status::claim_status) would give it: it waits further back than
/// the positions shown, its pod (if it names one) is there, and its status says exactly that
/// (`beyond` is [`beyond_shown`](super::status::beyond_shown) of its lease). `false` only
/// means "build it and compare".
pub fn waits_unchanged(claim: &CachedClaim, plan: &Plan, pod: PodPresence, beyond: &str) -> bool {
    let Some(s) = claim.status.as_ref() else {
        return false;
    };
    let position = claim
        .metadata
        .name
        .as_deref()
        .and_then(|n| plan.position(n));
    position.is_some_and(|p| p >= POSITIONS_SHOWN)
        && pod != PodPresence::Missing
        && !ends(claim, plan)
        && s.phase == Some(ClaimPhase::Pending)
        && s.queue_position.is_none()
        && s.fencing_token.is_none()
        && s.grant_time.is_none()
        && s.lease_duration_seconds.is_none()
        && s.observed_generation == CLAIM_GENERATION
        && s.message.as_deref() == Some(beyond)
        && found(s, "LeaseFound")
        && (claim.spec.pod_name.is_none() || found(s, "PodFound"))
}

/// Is the claim the holder that ends in this plan?
fn ends(claim: &CachedClaim, plan: &Plan) -> bool {
    let uid = claim.metadata.uid.as_deref();
    plan.ended
        .as_ref()
        .is_some_and(|e| Some(e.uid.as_str()) == uid)
}

/// Does the condition `type_` already say "True, Found" as the operator writes it?
fn found(s: &CachedClaimStatus, type_: &str) -> bool {
    s.conditions
        .iter()
        .find(|c| c.type_ == type_)
        .is_some_and(|c| {
            c.status == "True"
                && c.reason == "Found"
                && c.message.is_empty()
                && c.observed_generation == CLAIM_GENERATION
        })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::jiff::Timestamp;

    use super::*;
    use crate::api::{FencedLeaseClaim, FencedLeaseClaimSpec, FencedLeaseStatus};
    use crate::operator::core::decide::{EndReason, Ended};
    use crate::operator::core::status::{beyond_shown, claim_status};

    fn claim(name: &str, pod: Option<&str>) -> FencedLeaseClaim {
        let mut c = FencedLeaseClaim::new(
            name,
            FencedLeaseClaimSpec {
                lease_name: "l".into(),
                holder_identity: name.into(),
                pod_name: pod.map(Into::into),
                renew_time: None,
            },
        );
        c.metadata.uid = Some(format!("uid-{name}"));
        c
    }

    /// A plan whose queue has `ahead` claims before `name`.
    fn plan_with(name: &str, ahead: usize) -> Plan {
        let mut queue: Vec<String> = (0..ahead).map(|i| format!("w-{i}")).collect();
        queue.push(name.into());
        let positions = queue
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), i))
            .collect();
        Plan {
            ended: None,
            grant: None,
            holder_uid: Some("uid-holder".into()),
            queue,
            expire: vec![],
            tokens_exhausted: false,
            unfenced: None,
            wake_at: None,
            positions,
            follows: None,
        }
    }

    /// The claim as it is once the operator has written what `claim_status` says.
    fn answered(c: &FencedLeaseClaim, plan: &Plan, pod: PodPresence) -> CachedClaim {
        let mut c = c.clone();
        let lease = FencedLeaseStatus::default();
        let status = claim_status(
            &c.clone().into(),
            "l",
            &lease,
            plan,
            pod,
            Timestamp::UNIX_EPOCH,
        );
        c.status = Some(status);
        c.into()
    }

    /// What `claim_status` gives it now (an hour later).
    fn again(c: &CachedClaim, plan: &Plan, pod: PodPresence) -> CachedClaimStatus {
        let lease = FencedLeaseStatus::default();
        let later = Timestamp::UNIX_EPOCH + std::time::Duration::from_secs(3600);
        claim_status(c, "l", &lease, plan, pod, later).into()
    }

    #[test]
    fn a_claim_far_back_that_says_so_is_unchanged_as_claim_status_finds() {
        let beyond = beyond_shown("l");
        for pod in [None, Some("p")] {
            let plan = plan_with("c", POSITIONS_SHOWN + 5);
            let presence = if pod.is_some() {
                PodPresence::Present
            } else {
                PodPresence::NotNamed
            };
            let c = answered(&claim("c", pod), &plan, presence);
            assert!(waits_unchanged(&c, &plan, presence, &beyond), "pod {pod:?}");
            assert_eq!(c.status.as_ref(), Some(&again(&c, &plan, presence)));
        }
    }

    #[test]
    fn anything_else_is_built_and_compared() {
        let beyond = beyond_shown("l");
        let far = plan_with("c", POSITIONS_SHOWN + 5);
        let c = answered(&claim("c", None), &far, PodPresence::NotNamed);

        // Moved into the positions shown: its status changes.
        let near = plan_with("c", 3);
        assert!(!waits_unchanged(&c, &near, PodPresence::NotNamed, &beyond));
        assert_ne!(
            c.status.as_ref(),
            Some(&again(&c, &near, PodPresence::NotNamed))
        );

        // No longer queued (not eligible): built.
        let gone = plan_with("other", POSITIONS_SHOWN + 5);
        assert!(!waits_unchanged(&c, &gone, PodPresence::NotNamed, &beyond));

        // Its pod went missing: the message and PodFound change.
        let p = answered(&claim("c", Some("p")), &far, PodPresence::Present);
        assert!(!waits_unchanged(&p, &far, PodPresence::Missing, &beyond));
        assert_ne!(
            p.status.as_ref(),
            Some(&again(&p, &far, PodPresence::Missing))
        );

        // A pod found missing before, back now: PodFound changes.
        let was_missing = answered(&claim("c", Some("p")), &far, PodPresence::Missing);
        assert!(!waits_unchanged(
            &was_missing,
            &far,
            PodPresence::Present,
            &beyond
        ));
        assert_ne!(
            was_missing.status.as_ref(),
            Some(&again(&was_missing, &far, PodPresence::Present))
        );

        // Never answered, or of another lease's message.
        let fresh: CachedClaim = claim("c", None).into();
        assert!(!waits_unchanged(
            &fresh,
            &far,
            PodPresence::NotNamed,
            &beyond
        ));
        assert!(!waits_unchanged(
            &c,
            &far,
            PodPresence::NotNamed,
            &beyond_shown("m")
        ));

        // The holder that ends.
        let ending = Plan {
            ended: Some(Ended {
                uid: "uid-c".into(),
                reason: EndReason::Expired,
            }),
            ..far.clone()
        };
        assert!(!waits_unchanged(
            &c,
            &ending,
            PodPresence::NotNamed,
            &beyond
        ));
    }
}
