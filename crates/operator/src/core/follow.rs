//! Who holds a lease that follows a coordination Lease (`spec.follow`): the Lease's holder,
//! as the pod its `holderIdentity` names. No claim is granted; each new term of the Lease (a
//! new holder identity, a new count of transitions, a new Lease object, or another pod of the
//! holder's name) is a grant, with a token from [`next_token`] like any other (I1).
//!
//! A holder that names no pod is not guessed at: nobody holds then, so no pod may write what
//! the lease fences (fail closed), and the condition says which identity and pods were sought.

use crate::core::decide::{EndReason, Ended, Follow, FollowState as State, Grant, Plan};
use crate::core::token::{TokenFloor, next_token};
use fenced_lease_api::{FollowedTerm, LeaseHolder};

/// The followed Lease as the decision needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Followed {
    /// No Lease of that name exists (not yet, or no longer).
    Missing,
    /// The Lease, its holder's identity (`None`: nobody holds it) and the pod that identity
    /// names, if one exists (name, UID).
    Lease {
        term: FollowedTerm,
        identity: Option<String>,
        pod: Option<(String, String)>,
        /// The pod names sought for the identity.
        sought: Vec<String>,
    },
}

/// The lease as a following decision needs it.
#[derive(Clone, Debug, PartialEq)]
pub struct FollowView<'a> {
    /// The followed Lease's name.
    pub lease: &'a str,
    pub followed: &'a Followed,
    /// The holder the lease status names now.
    pub current: Option<&'a LeaseHolder>,
    /// The lease is being deleted: nobody holds it.
    pub deleting: bool,
    /// Why the lease's fence is not in force, if it is not: no one is granted (I12).
    pub unfenced: Option<&'a str>,
    /// What the next token must exceed.
    pub floor: TokenFloor,
}

/// The holder the followed Lease names, if it names a pod.
fn wanted(followed: &Followed) -> Option<LeaseHolder> {
    let Followed::Lease {
        term,
        identity: Some(identity),
        pod: Some((pod, uid)),
        ..
    } = followed
    else {
        return None;
    };
    Some(LeaseHolder {
        identity: identity.clone(),
        pod_name: Some(pod.clone()),
        pod_uid: Some(uid.clone()),
        lease: Some(term.clone()),
        ..Default::default()
    })
}

fn state(followed: &Followed) -> State {
    match followed {
        Followed::Missing => State::Missing,
        Followed::Lease { identity: None, .. } => State::Free,
        Followed::Lease {
            identity: Some(identity),
            pod: None,
            sought,
            ..
        } => State::NoPod {
            identity: identity.clone(),
            sought: sought.clone(),
        },
        Followed::Lease { pod: Some(_), .. } => State::Held,
    }
}

/// Decides one step: the current holder ends when the followed Lease names another term (or
/// none), and that term's pod is granted a new token unless the fence is not in force.
pub fn decide_follow(view: &FollowView) -> Plan {
    let wanted = wanted(view.followed).filter(|_| !view.deleting);
    let mut plan = Plan {
        follows: Some(Follow {
            lease: view.lease.to_owned(),
            state: state(view.followed),
            holder: None,
        }),
        ..Plan::default()
    };
    if view.current.is_some() && view.current == wanted.as_ref() {
        return plan;
    }
    if let Some(current) = view.current {
        plan.ended = Some(Ended {
            uid: current.claim_uid.clone(),
            reason: if view.deleting {
                EndReason::LeaseDeleted
            } else {
                EndReason::Followed
            },
        });
    }
    let Some(wanted) = wanted else {
        return plan;
    };
    if let Some(cause) = view.unfenced {
        plan.unfenced = Some(cause.to_owned());
        return plan;
    }
    match next_token(view.floor) {
        Some(token) => {
            plan.grant = Some(Grant {
                claim: String::new(),
                uid: String::new(),
                token,
            });
            if let Some(follow) = plan.follows.as_mut() {
                follow.holder = Some(wanted);
            }
        }
        None => plan.tokens_exhausted = true,
    }
    plan
}

/// The `Held` condition of a following lease that nobody holds: why.
pub fn not_held(follow: &Follow) -> (&'static str, &'static str, String) {
    let lease = &follow.lease;
    match &follow.state {
        State::Missing => (
            "False",
            "LeaseNotFound",
            format!("waiting for Lease {lease} (coordination.k8s.io) to exist: nobody holds it"),
        ),
        State::NoPod { identity, sought } => (
            "False",
            "HolderPodNotFound",
            format!(
                "Lease {lease} is held by {identity:?}, which names no pod of this namespace (sought: {}): nobody holds this lease, and no pod may write what it fences",
                sought.join(", ")
            ),
        ),
        State::Free | State::Held => ("False", "Free", format!("Lease {lease} names no holder")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW_MS: i64 = 1_764_500_000_000;

    fn term(uid: &str, transitions: i64) -> FollowedTerm {
        FollowedTerm {
            name: "ctrl".into(),
            uid: uid.into(),
            lease_transitions: transitions,
        }
    }

    fn held_by(identity: &str, pod: &str, pod_uid: &str, transitions: i64) -> Followed {
        Followed::Lease {
            term: term("lease-1", transitions),
            identity: Some(identity.into()),
            pod: Some((pod.into(), pod_uid.into())),
            sought: vec![pod.into()],
        }
    }

    fn view<'a>(followed: &'a Followed, current: Option<&'a LeaseHolder>) -> FollowView<'a> {
        FollowView {
            lease: "ctrl",
            followed,
            current,
            deleting: false,
            unfenced: None,
            floor: TokenFloor {
                last_issued: 40,
                recorded: 0,
                min_token: 0,
                now_ms: 7,
            },
        }
    }

    fn granted(plan: &Plan) -> Option<(i64, LeaseHolder)> {
        let holder = plan.follows.as_ref()?.holder.clone()?;
        Some((plan.grant.as_ref()?.token, holder))
    }

    #[test]
    fn the_lease_holders_pod_is_granted_once_per_term() {
        let a = held_by("a_1", "a", "pod-a", 1);
        let plan = decide_follow(&view(&a, None));
        let (token, holder) = granted(&plan).expect("a grant");
        assert_eq!(token, 41, "above the last token issued");
        assert_eq!(
            (holder.identity.as_str(), holder.pod_name.as_deref()),
            ("a_1", Some("a"))
        );
        assert_eq!(holder.claim_uid, "", "no claim holds a followed lease");
        assert_eq!(plan.ended, None);
        // The same term, seen again: nothing to do.
        let again = decide_follow(&view(&a, Some(&holder)));
        assert_eq!((again.ended, again.grant), (None, None));
    }

    #[test]
    fn every_new_term_ends_the_holder_and_takes_a_higher_token() {
        let a = held_by("a_1", "a", "pod-a", 1);
        let (_, holder) = granted(&decide_follow(&view(&a, None))).unwrap();
        for (why, next) in [
            ("another holder", held_by("b_1", "b", "pod-b", 2)),
            (
                "the same holder again, a new term",
                held_by("a_1", "a", "pod-a", 3),
            ),
            (
                "a replacement pod of the same name",
                held_by("a_1", "a", "pod-a2", 1),
            ),
            (
                "the Lease deleted and created again",
                Followed::Lease {
                    term: term("lease-2", 1),
                    identity: Some("a_1".into()),
                    pod: Some(("a".into(), "pod-a".into())),
                    sought: vec![],
                },
            ),
        ] {
            let plan = decide_follow(&view(&next, Some(&holder)));
            assert_eq!(
                plan.ended.as_ref().map(|e| e.reason),
                Some(EndReason::Followed),
                "{why}"
            );
            assert_eq!(granted(&plan).map(|(t, _)| t), Some(41), "{why}");
        }
    }

    #[test]
    fn nobody_holds_when_the_lease_is_missing_free_or_names_no_pod() {
        let (_, holder) =
            granted(&decide_follow(&view(&held_by("a", "a", "pod-a", 1), None))).unwrap();
        let no_pod = Followed::Lease {
            term: term("lease-1", 2),
            identity: Some("node-7".into()),
            pod: None,
            sought: vec!["node-7".into()],
        };
        let free = Followed::Lease {
            term: term("lease-1", 1),
            identity: None,
            pod: None,
            sought: vec![],
        };
        for (followed, state) in [
            (Followed::Missing, State::Missing),
            (free, State::Free),
            (
                no_pod,
                State::NoPod {
                    identity: "node-7".into(),
                    sought: vec!["node-7".into()],
                },
            ),
        ] {
            let plan = decide_follow(&view(&followed, Some(&holder)));
            assert!(plan.ended.is_some(), "{state:?}: the holder ends");
            assert_eq!(plan.grant, None, "{state:?}: nobody is granted");
            assert_eq!(plan.follows.as_ref().map(|f| &f.state), Some(&state));
            let idle = decide_follow(&view(&followed, None));
            assert_eq!((idle.ended, idle.grant), (None, None), "{state:?}");
        }
    }

    #[test]
    fn a_claim_holder_ends_when_the_lease_starts_following() {
        let claim_holder = LeaseHolder {
            claim: "c".into(),
            claim_uid: "uid-c".into(),
            identity: "c".into(),
            ..Default::default()
        };
        let a = held_by("a", "a", "pod-a", 1);
        let plan = decide_follow(&view(&a, Some(&claim_holder)));
        assert_eq!(
            plan.ended,
            Some(Ended {
                uid: "uid-c".into(),
                reason: EndReason::Followed
            })
        );
        assert!(plan.grant.is_some());
    }

    #[test]
    fn no_grant_while_the_fence_is_not_in_force_or_the_lease_is_deleted() {
        let a = held_by("a", "a", "pod-a", 1);
        let unfenced = FollowView {
            unfenced: Some("slot"),
            ..view(&a, None)
        };
        let plan = decide_follow(&unfenced);
        assert_eq!(plan.grant, None);
        assert_eq!(plan.unfenced.as_deref(), Some("slot"));
        let (_, holder) = granted(&decide_follow(&view(&a, None))).unwrap();
        let deleting = FollowView {
            deleting: true,
            ..view(&a, Some(&holder))
        };
        let plan = decide_follow(&deleting);
        assert_eq!(plan.ended.map(|e| e.reason), Some(EndReason::LeaseDeleted));
        assert_eq!(plan.grant, None);
    }

    #[test]
    fn tokens_follow_the_same_floor_as_grants() {
        let a = held_by("a", "a", "pod-a", 1);
        let floor = |last_issued| FollowView {
            floor: TokenFloor {
                last_issued,
                now_ms: NOW_MS,
                ..TokenFloor::default()
            },
            ..view(&a, None)
        };
        assert_eq!(granted(&decide_follow(&floor(0))).unwrap().0, NOW_MS);
        let spent = decide_follow(&floor(fenced_lease_api::MAX_TOKEN));
        assert!(spent.tokens_exhausted && spent.grant.is_none());
    }
}
