//! The claim a holder writes (a fresh one per acquire, named by the holder so that a create
//! whose answer was lost can be found again) and its heartbeat, plus the few facts a holder
//! reads back from its claim and from the lease.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use rand::Rng;

use super::options::PodRef;
use crate::api::{
    ClaimPhase, FencedLease, FencedLeaseClaim, FencedLeaseClaimSpec, FencedLeaseStatus,
};

/// Length of the random part of a claim name.
const SUFFIX_LEN: usize = 10;

/// A fresh claim name, `<lease>-<10 random characters>`, chosen by the holder rather than the
/// apiserver (`generateName`): when a create times out, the holder does not know whether the
/// claim exists; with a name of its own it can create again (409 = it exists: adopt it) or
/// delete it, instead of leaving a claim nobody heartbeats in the queue.
pub(crate) fn claim_name(lease: &str) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    let suffix: String = (0..SUFFIX_LEN)
        .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
        .collect();
    format!("{lease}-{suffix}")
}

/// The annotations that record a claim's creator (I7): its username, and, when it
/// authenticates with a pod-bound token, that pod's name and UID.
pub(crate) const CREATED_BY: &str = "fencing.dev/created-by";
pub(crate) const CREATED_BY_POD: &str = "fencing.dev/created-by-pod";
pub(crate) const CREATED_BY_POD_UID: &str = "fencing.dev/created-by-pod-uid";

/// The creator annotations a holder stamps on its claims, from the answer to its
/// `SelfSubjectReview` (what the apiserver authenticates it as: the same `userInfo` the
/// claim-ownership ValidatingAdmissionPolicy compares them with at create). Where the
/// apiserver serves MutatingAdmissionPolicy, the chart's policy overwrites them with the same
/// values; where it does not (before Kubernetes 1.36), a claim without them is refused.
pub(crate) fn creator_annotations(review: &SelfSubjectReview) -> BTreeMap<String, String> {
    let user = review.status.as_ref().and_then(|s| s.user_info.as_ref());
    let mut annotations = BTreeMap::new();
    let Some(user) = user else {
        return annotations;
    };
    if let Some(username) = &user.username {
        annotations.insert(CREATED_BY.to_string(), username.clone());
    }
    let extra = |key: &str| {
        user.extra
            .as_ref()
            .and_then(|e| e.get(key))
            .and_then(|v| v.first())
            .cloned()
    };
    if let (Some(pod), Some(uid)) = (
        extra("authentication.kubernetes.io/pod-name"),
        extra("authentication.kubernetes.io/pod-uid"),
    ) {
        annotations.insert(CREATED_BY_POD.to_string(), pod);
        annotations.insert(CREATED_BY_POD_UID.to_string(), uid);
    }
    annotations
}

/// A new claim `name` on `lease`, with its first heartbeat and its creator's annotations
/// ([`creator_annotations`]). With a pod whose UID is known, the claim is owned by it, so the
/// pod's deletion frees it.
pub(crate) fn new_claim(
    name: &str,
    lease: &str,
    identity: &str,
    pod: Option<&PodRef>,
    creator: &BTreeMap<String, String>,
    now: Timestamp,
) -> FencedLeaseClaim {
    let owner_references = pod.and_then(|p| {
        p.uid.as_ref().map(|uid| {
            vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Pod".into(),
                name: p.name.clone(),
                uid: uid.clone(),
                ..Default::default()
            }]
        })
    });
    FencedLeaseClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            owner_references,
            annotations: (!creator.is_empty()).then(|| creator.clone()),
            ..Default::default()
        },
        spec: FencedLeaseClaimSpec {
            lease_name: lease.into(),
            holder_identity: identity.into(),
            pod_name: pod.map(|p| p.name.clone()),
            renew_time: Some(MicroTime(now)),
        },
        status: None,
    }
}

/// The heartbeat: a merge patch that writes `now` into `spec.renewTime`. Any new value will
/// do; the operator times expiry from when it sees the value change.
pub(crate) fn heartbeat_patch(now: Timestamp) -> serde_json::Value {
    serde_json::json!({ "spec": { "renewTime": MicroTime(now) } })
}

/// Whether a refused heartbeat was refused because the claim is over: the CRD's CEL rule
/// freezes `spec.renewTime` once the phase is `Expired` or `Revoked` (I9), and the apiserver
/// answers 422 Invalid with the rule's message.
pub(crate) fn is_final_phase_refusal(status: &kube::core::Status) -> bool {
    status.code == 422
        && status
            .message
            .contains("the claim has Expired or was Revoked")
}

/// What a holder needs from its claim's status.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct ClaimView {
    pub phase: Option<ClaimPhase>,
    pub token: Option<i64>,
    pub queue_position: Option<i32>,
    pub message: Option<String>,
    /// `LeaseFound` condition: `Some(false)` when the operator found no such lease.
    pub lease_found: Option<bool>,
    /// The term's duration, fixed at grant (I10), once the operator fills it in.
    pub term_duration: Option<Duration>,
}

impl From<&FencedLeaseClaim> for ClaimView {
    fn from(claim: &FencedLeaseClaim) -> Self {
        let Some(status) = &claim.status else {
            return ClaimView::default();
        };
        ClaimView {
            phase: status.phase,
            token: status.fencing_token,
            queue_position: status.queue_position,
            message: status.message.clone(),
            lease_found: status
                .conditions
                .iter()
                .find(|c| c.type_ == "LeaseFound")
                .map(|c| c.status != "False"),
            term_duration: status.term_duration(),
        }
    }
}

/// What a holder needs from the lease, whose status is the source of truth.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct LeaseView {
    pub holder_claim: Option<String>,
    pub holder_identity: Option<String>,
    pub token: i64,
    /// `spec.leaseDurationSeconds`: the duration of the *next* term.
    pub spec_duration: Duration,
    /// `status.leaseDurationSeconds`: the running term's duration, fixed at its grant (I10).
    pub term_duration: Option<Duration>,
}

impl From<&FencedLease> for LeaseView {
    fn from(lease: &FencedLease) -> Self {
        let status = lease.status.as_ref();
        let holder = status.and_then(|s| s.holder.as_ref());
        LeaseView {
            holder_claim: holder.map(|h| h.claim.clone()),
            holder_identity: holder.map(|h| h.identity.clone()),
            token: status.map_or(0, |s| s.fencing_token),
            spec_duration: lease.spec.lease_duration(),
            term_duration: status.and_then(FencedLeaseStatus::term_duration),
        }
    }
}

#[cfg(test)]
mod tests {
    use kube::Resource;

    use super::*;

    #[test]
    fn a_claim_is_named_by_the_holder_and_carries_a_first_heartbeat() {
        let now = Timestamp::from_second(1_700_000_000).unwrap();
        let name = claim_name("db");
        assert!(
            name.starts_with("db-") && name.len() == 3 + SUFFIX_LEN,
            "{name}"
        );
        assert_ne!(claim_name("db"), name, "names are random");
        let claim = new_claim(&name, "db", "worker-1", None, &BTreeMap::new(), now);
        assert_eq!(claim.metadata.name.as_deref(), Some(name.as_str()));
        assert_eq!(claim.metadata.generate_name, None);
        assert_eq!(claim.spec.lease_name, "db");
        assert_eq!(claim.spec.holder_identity, "worker-1");
        assert_eq!(claim.spec.pod_name, None);
        assert_eq!(claim.spec.renew_time, Some(MicroTime(now)));
        assert_eq!(claim.metadata.owner_references, None);
    }

    #[test]
    fn a_claim_names_its_pod_and_is_owned_by_it_when_the_uid_is_known() {
        let now = Timestamp::now();
        let pod = PodRef::new("web-0", Some("uid-1".into()));
        let claim = new_claim("db-x", "db", "web-0", Some(&pod), &BTreeMap::new(), now);
        assert_eq!(claim.spec.pod_name.as_deref(), Some("web-0"));
        let owners = claim.metadata.owner_references.unwrap();
        assert_eq!(owners.len(), 1);
        assert_eq!(
            (
                owners[0].kind.as_str(),
                owners[0].name.as_str(),
                owners[0].uid.as_str()
            ),
            ("Pod", "web-0", "uid-1")
        );

        let no_uid = PodRef::new("web-0", None);
        let claim = new_claim("db-x", "db", "web-0", Some(&no_uid), &BTreeMap::new(), now);
        assert_eq!(claim.spec.pod_name.as_deref(), Some("web-0"));
        assert_eq!(claim.metadata.owner_references, None);
    }

    #[test]
    fn a_claim_carries_its_creator_as_the_apiserver_authenticates_it() {
        let review = |extra: serde_json::Value| -> SelfSubjectReview {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview",
                "status": {"userInfo": {"username": "system:serviceaccount:prod:web", "extra": extra}}
            }))
            .unwrap()
        };
        let from_pod = creator_annotations(&review(serde_json::json!({
            "authentication.kubernetes.io/pod-name": ["web-0"],
            "authentication.kubernetes.io/pod-uid": ["uid-1"],
        })));
        assert_eq!(
            from_pod,
            BTreeMap::from([
                (
                    CREATED_BY.to_string(),
                    "system:serviceaccount:prod:web".to_string()
                ),
                (CREATED_BY_POD.to_string(), "web-0".to_string()),
                (CREATED_BY_POD_UID.to_string(), "uid-1".to_string()),
            ])
        );
        let claim = new_claim("db-x", "db", "web-0", None, &from_pod, Timestamp::now());
        assert_eq!(claim.metadata.annotations, Some(from_pod));

        let not_a_pod = creator_annotations(&review(serde_json::json!({})));
        assert_eq!(
            not_a_pod,
            BTreeMap::from([(
                CREATED_BY.to_string(),
                "system:serviceaccount:prod:web".to_string()
            )])
        );
        let unanswered = creator_annotations(&SelfSubjectReview::default());
        assert!(unanswered.is_empty());
        let claim = new_claim("db-x", "db", "w", None, &unanswered, Timestamp::now());
        assert_eq!(claim.metadata.annotations, None);
    }

    #[test]
    fn heartbeat_writes_only_renew_time_with_microseconds() {
        let now = Timestamp::from_microsecond(1_700_000_000_123_456).unwrap();
        let patch = heartbeat_patch(now);
        assert_eq!(
            patch,
            serde_json::json!({"spec": {"renewTime": "2023-11-14T22:13:20.123456Z"}})
        );
    }

    #[test]
    fn claim_view_reads_phase_token_and_lease_found() {
        let claim: FencedLeaseClaim = serde_json::from_value(serde_json::json!({
            "apiVersion": FencedLeaseClaim::api_version(&()), "kind": "FencedLeaseClaim",
            "metadata": {"name": "db-x"},
            "spec": {"leaseName": "db", "holderIdentity": "a"},
            "status": {"phase": "Pending", "queuePosition": 2, "conditions": [
                {"type": "LeaseFound", "status": "False", "reason": "NotFound", "message": "",
                 "lastTransitionTime": "2024-01-01T00:00:00Z"}
            ]}
        }))
        .unwrap();
        let view = ClaimView::from(&claim);
        assert_eq!(view.phase, Some(ClaimPhase::Pending));
        assert_eq!(view.queue_position, Some(2));
        assert_eq!(view.lease_found, Some(false));
        assert_eq!(view.token, None);
        assert_eq!(view.term_duration, None);
    }

    #[test]
    fn term_durations_come_from_the_claim_and_lease_status() {
        let claim: FencedLeaseClaim = serde_json::from_value(serde_json::json!({
            "apiVersion": FencedLeaseClaim::api_version(&()), "kind": "FencedLeaseClaim",
            "metadata": {"name": "db-x"},
            "spec": {"leaseName": "db", "holderIdentity": "a"},
            "status": {"phase": "Granted", "fencingToken": 9, "leaseDurationSeconds": 10}
        }))
        .unwrap();
        assert_eq!(
            ClaimView::from(&claim).term_duration,
            Some(Duration::from_secs(10))
        );
        let lease: FencedLease = serde_json::from_value(serde_json::json!({
            "apiVersion": FencedLease::api_version(&()), "kind": "FencedLease",
            "metadata": {"name": "db"},
            "spec": {"leaseDurationSeconds": 3600},
            "status": {"fencingToken": 9, "leaseDurationSeconds": 10,
                       "holder": {"claim": "db-x", "identity": "a"}}
        }))
        .unwrap();
        let view = LeaseView::from(&lease);
        assert_eq!(view.spec_duration, Duration::from_secs(3600));
        assert_eq!(view.term_duration, Some(Duration::from_secs(10)));
        assert_eq!(view.holder_identity.as_deref(), Some("a"));
    }

    #[test]
    fn only_the_final_phase_rule_counts_as_a_final_refusal() {
        let status = |code, message: &str| kube::core::Status {
            code,
            message: message.into(),
            ..Default::default()
        };
        assert!(is_final_phase_refusal(&status(
            422,
            "FencedLeaseClaim.fencing.dev \"db-x\" is invalid: <nil>: Invalid value: \"object\": the claim has Expired or was Revoked: its heartbeat (spec.renewTime) can no longer change; create a new claim to queue again"
        )));
        assert!(!is_final_phase_refusal(&status(
            422,
            "leaseName is immutable"
        )));
        assert!(!is_final_phase_refusal(&status(
            409,
            "the claim has Expired or was Revoked"
        )));
    }
}
