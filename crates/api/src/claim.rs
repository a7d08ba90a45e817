//! `FencedLeaseClaim`: one candidate's request for a lease, bound to it like a PVC to a PV.
//! The candidate writes the spec (and its heartbeat); only the operator writes the status.
//! Deleting the claim releases the lease.
// kube's derive takes one `printcolumn(...)` per column; clippy reads their repeated
// `type_ = ...` keys as duplicated attributes.
#![allow(clippy::duplicated_attributes)]

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime};
use kube::core::Rule;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::{MAX_LEASE_NAME_LEN, duration_from_seconds};

/// A candidate's request for a lease.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "fencing.dev",
    version = "v1alpha1",
    kind = "FencedLeaseClaim",
    plural = "fencedleaseclaims",
    shortname = "fclaim",
    category = "fencing",
    namespaced,
    status = "FencedLeaseClaimStatus",
    doc = "A candidate's request for a FencedLease. Delete it to release the lease.",
    validation = Rule::new(
        "!has(oldSelf.status) || !has(oldSelf.status.phase) || !(oldSelf.status.phase in ['Expired', 'Revoked']) || (has(self.spec.renewTime) == has(oldSelf.spec.renewTime) && (!has(self.spec.renewTime) || self.spec.renewTime == oldSelf.spec.renewTime))"
    ).message("the claim has Expired or was Revoked: its heartbeat (spec.renewTime) can no longer change; create a new claim to queue again"),
    validation = Rule::new(
        "!has(oldSelf.status) || !has(oldSelf.status.phase) || !(oldSelf.status.phase in ['Expired', 'Revoked']) || (has(self.status) && has(self.status.phase) && self.status.phase == oldSelf.status.phase)"
    ).message("Expired and Revoked are final phases of a claim"),
    printcolumn(name = "Lease", type_ = "string", json_path = ".spec.leaseName"),
    printcolumn(name = "Holder", type_ = "string", json_path = ".spec.holderIdentity"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Token", type_ = "integer", json_path = ".status.fencingToken"),
    printcolumn(
        name = "Position",
        type_ = "integer",
        json_path = ".status.queuePosition",
        description = "Place in the queue while Pending"
    ),
    printcolumn(
        name = "Pod",
        type_ = "string",
        json_path = ".spec.podName",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(
    validation = Rule::new("self.leaseName == oldSelf.leaseName").message("leaseName is immutable").field_path(".leaseName"),
    validation = Rule::new("self.holderIdentity == oldSelf.holderIdentity").message("holderIdentity is immutable").field_path(".holderIdentity"),
    validation = Rule::new("has(self.podName) == has(oldSelf.podName) && (!has(self.podName) || self.podName == oldSelf.podName)").message("podName is immutable").field_path(".podName"),
)]
#[serde(rename_all = "camelCase")]
pub struct FencedLeaseClaimSpec {
    /// Name of the `FencedLease` (in the same namespace) this claim asks for. Immutable.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    #[x_kube(validation = lease_name_rule())]
    pub lease_name: String,

    /// Who is asking: a stable, human-readable identity (e.g. the pod name). Immutable.
    #[schemars(length(min = 1, max = 253))]
    pub holder_identity: String,

    /// Pod of the holder, in the same namespace: annotated with the token while it holds the
    /// lease; its deletion releases the lease. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub pod_name: Option<String>,

    /// The heartbeat: the candidate updates it every leaseDurationSeconds/3 or so. The operator
    /// expires a holder whose heartbeat it has not seen change for leaseDurationSeconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_time: Option<MicroTime>,
}

/// `leaseName` fits the name part of a token's annotation key, as the lease's name does.
fn lease_name_rule() -> Rule {
    Rule::new(format!("self.size() <= {MAX_LEASE_NAME_LEN}")).message(
        format!("leaseName is limited to {MAX_LEASE_NAME_LEN} characters: FencedLease names become the name part of the pod annotation key token.fencing.dev/<name>").as_str(),
    )
}

/// Where a claim stands.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, schemars::JsonSchema)]
pub enum ClaimPhase {
    /// Waiting in the queue.
    Pending,
    /// Holds the lease with `status.fencingToken`.
    Granted,
    /// Held the lease, but its heartbeat stopped for longer than the lease duration.
    Expired,
    /// Held the lease, but it was taken away (e.g. its pod was deleted or the status was reset).
    Revoked,
}

/// Observed state of a claim, written only by the operator.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct FencedLeaseClaimStatus {
    /// `Pending` -> `Granted` -> `Expired` | `Revoked`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<ClaimPhase>,

    /// The token this claim was granted; carry it to the protected resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub fencing_token: Option<i64>,

    /// When the lease was granted to this claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant_time: Option<MicroTime>,

    /// Duration of this claim's term, fixed at its grant (the lease's `leaseDurationSeconds`
    /// then). The holder's safe deadline uses this value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_duration_seconds: Option<i32>,

    /// Place in the queue while `Pending` (1 = next).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_position: Option<i32>,

    /// A human-readable account of the phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,

    /// Standard conditions (`Granted`, `PodFound`, `LeaseFound`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,

    /// Not set by the operator: every heartbeat changes the spec (`renewTime`), so the
    /// generation moves with each one. Kept for clients that wrote it before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Every field of [`FencedLeaseClaimStatus`], as the API spells it.
const STATUS_FIELDS: [&str; 8] = [
    "phase",
    "fencingToken",
    "grantTime",
    "leaseDurationSeconds",
    "queuePosition",
    "message",
    "conditions",
    "observedGeneration",
];

impl FencedLeaseClaimStatus {
    /// This claim's term (`leaseDurationSeconds`, fixed at its grant), once the operator has
    /// set it.
    pub fn term_duration(&self) -> Option<Duration> {
        self.lease_duration_seconds.map(duration_from_seconds)
    }

    /// The `status` of a JSON merge patch that leaves the status exactly this one, as a
    /// replace would: every field this one leaves out is sent as `null`, which removes it.
    ///
    /// The operator writes claim statuses this way rather than by server-side apply, which
    /// costs the apiserver twice the CPU (bench/runs/2026-12-03-claim-status-patch).
    pub fn merge_patch(&self) -> serde_json::Value {
        let mut fields = match serde_json::to_value(self) {
            Ok(serde_json::Value::Object(fields)) => fields,
            _ => serde_json::Map::new(), // a struct of plain fields always serializes to one
        };
        for name in STATUS_FIELDS {
            fields.entry(name).or_insert(serde_json::Value::Null);
        }
        serde_json::Value::Object(fields)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    #[test]
    fn a_merge_patch_names_every_field_and_removes_those_left_out() {
        // Built without `..Default::default()`: a new field fails to compile here until it is
        // added to STATUS_FIELDS and to this test.
        let full = FencedLeaseClaimStatus {
            phase: Some(ClaimPhase::Granted),
            fencing_token: Some(7),
            grant_time: Some(MicroTime(Timestamp::UNIX_EPOCH)),
            lease_duration_seconds: Some(15),
            queue_position: Some(1),
            message: Some("m".into()),
            conditions: vec![Condition {
                type_: "Granted".into(),
                status: "True".into(),
                reason: "Granted".into(),
                message: String::new(),
                last_transition_time: Time(Timestamp::UNIX_EPOCH),
                observed_generation: None,
            }],
            observed_generation: Some(1),
        };
        let serialized = serde_json::to_value(&full).unwrap();
        let mut names: Vec<&str> = serialized
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        names.sort_unstable();
        let mut known = STATUS_FIELDS.to_vec();
        known.sort_unstable();
        assert_eq!(
            names, known,
            "STATUS_FIELDS lists every field of the status"
        );
        assert_eq!(
            full.merge_patch(),
            serialized,
            "a full status patches as itself"
        );

        let granted = FencedLeaseClaimStatus {
            phase: Some(ClaimPhase::Granted),
            fencing_token: Some(8),
            ..FencedLeaseClaimStatus::default()
        };
        let patch = granted.merge_patch();
        assert_eq!(patch["phase"], "Granted");
        assert_eq!(patch["fencingToken"], 8);
        for removed in ["queuePosition", "message", "conditions", "grantTime"] {
            assert!(
                patch[removed].is_null(),
                "{removed} is sent as null: {patch}"
            );
            assert!(
                patch.as_object().unwrap().contains_key(removed),
                "{removed} is sent"
            );
        }
    }
}
