//! The claim a holder writes (a fresh one per acquire, never an adopted one) and its
//! heartbeat, plus the few facts a holder reads back from its claim and from the lease.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;

use super::options::PodRef;
use crate::api::{ClaimPhase, FencedLease, FencedLeaseClaim, FencedLeaseClaimSpec};

/// A new claim on `lease`, named by the apiserver (`<lease>-xxxxx`), with its first heartbeat.
/// With a pod whose UID is known, the claim is owned by it, so the pod's deletion frees it.
pub(crate) fn new_claim(
    lease: &str,
    identity: &str,
    pod: Option<&PodRef>,
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
            generate_name: Some(format!("{lease}-")),
            owner_references,
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

/// What a holder needs from its claim's status.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct ClaimView {
    pub phase: Option<ClaimPhase>,
    pub token: Option<i64>,
    pub queue_position: Option<i32>,
    pub message: Option<String>,
    /// `LeaseFound` condition: `Some(false)` when the operator found no such lease.
    pub lease_found: Option<bool>,
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
        }
    }
}

/// What a holder needs from the lease's status, the source of truth.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct LeaseView {
    pub holder_claim: Option<String>,
    pub token: i64,
}

impl From<&FencedLease> for LeaseView {
    fn from(lease: &FencedLease) -> Self {
        let status = lease.status.as_ref();
        LeaseView {
            holder_claim: status
                .and_then(|s| s.holder.as_ref())
                .map(|h| h.claim.clone()),
            token: status.map_or(0, |s| s.fencing_token),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_is_fresh_named_by_the_server_and_carries_a_first_heartbeat() {
        let now = Timestamp::from_second(1_700_000_000).unwrap();
        let claim = new_claim("db", "worker-1", None, now);
        assert_eq!(claim.metadata.generate_name.as_deref(), Some("db-"));
        assert_eq!(claim.metadata.name, None);
        assert_eq!(claim.spec.lease_name, "db");
        assert_eq!(claim.spec.holder_identity, "worker-1");
        assert_eq!(claim.spec.pod_name, None);
        assert_eq!(claim.spec.renew_time, Some(MicroTime(now)));
        assert_eq!(claim.metadata.owner_references, None);
    }

    #[test]
    fn a_claim_names_its_pod_and_is_owned_by_it_when_the_uid_is_known() {
        let now = Timestamp::now();
        let pod = PodRef {
            name: "web-0".into(),
            uid: Some("uid-1".into()),
        };
        let claim = new_claim("db", "web-0", Some(&pod), now);
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

        let no_uid = PodRef {
            name: "web-0".into(),
            uid: None,
        };
        let claim = new_claim("db", "web-0", Some(&no_uid), now);
        assert_eq!(claim.spec.pod_name.as_deref(), Some("web-0"));
        assert_eq!(claim.metadata.owner_references, None);
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
            "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLeaseClaim",
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
    }
}
