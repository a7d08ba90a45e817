//! What the operator's cache keeps of a claim: what its decisions and writes read, in fewer
//! and smaller allocations than the API type: unread metadata is not kept, owner references
//! only as the one UID read, and the few words conditions are nearly always made of are
//! shared, not allocated per claim.

use std::borrow::Cow;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Resource;

use crate::state::cache::Keyed;
use fenced_lease_api::{
    ClaimPhase, FencedLeaseClaim, FencedLeaseClaimSpec, FencedLeaseClaimStatus,
};

/// A string that is nearly always one of the words below: those are not allocated per object.
pub type Word = Cow<'static, str>;

/// Condition types, statuses and reasons this operator writes.
const WORDS: &[&str] = &[
    "True",
    "False",
    "Unknown",
    "LeaseFound",
    "PodFound",
    "Found",
    "LeaseNotFound",
    "PodNotFound",
    "Held",
    "Free",
    "TokensExhausted",
    "Degraded",
    "Recovered",
];

fn word(s: String) -> Word {
    WORDS
        .iter()
        .find(|w| **w == s)
        .map_or(Cow::Owned(s), |w| Cow::Borrowed(*w))
}

/// A condition as cached: `Condition`'s fields, the common words not allocated.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CachedCondition {
    pub type_: Word,
    pub status: Word,
    pub reason: Word,
    pub message: Box<str>,
    pub observed_generation: Option<i64>,
    pub last_transition_time: Timestamp,
}

impl From<Condition> for CachedCondition {
    fn from(c: Condition) -> Self {
        Self {
            type_: word(c.type_),
            status: word(c.status),
            reason: word(c.reason),
            message: c.message.into_boxed_str(),
            observed_generation: c.observed_generation,
            last_transition_time: c.last_transition_time.0,
        }
    }
}

impl CachedCondition {
    pub fn to_condition(&self) -> Condition {
        Condition {
            type_: self.type_.to_string(),
            status: self.status.to_string(),
            reason: self.reason.to_string(),
            message: self.message.to_string(),
            observed_generation: self.observed_generation,
            last_transition_time: Time(self.last_transition_time),
        }
    }

    /// Equal to `c` but, perhaps, for when it last changed.
    fn same_but_time(&self, c: &Condition) -> bool {
        self.type_ == c.type_.as_str()
            && self.status == c.status.as_str()
            && self.reason == c.reason.as_str()
            && *self.message == *c.message
            && self.observed_generation == c.observed_generation
    }
}

impl PartialEq<Condition> for CachedCondition {
    fn eq(&self, c: &Condition) -> bool {
        self.same_but_time(c) && self.last_transition_time == c.last_transition_time.0
    }
}

/// A claim's status as cached: [`FencedLeaseClaimStatus`], compacted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct CachedClaimStatus {
    pub phase: Option<ClaimPhase>,
    pub fencing_token: Option<i64>,
    pub grant_time: Option<Timestamp>,
    pub lease_duration_seconds: Option<i32>,
    pub queue_position: Option<i32>,
    pub message: Option<Box<str>>,
    pub conditions: Box<[CachedCondition]>,
    pub observed_generation: Option<i64>,
}

impl From<FencedLeaseClaimStatus> for CachedClaimStatus {
    fn from(s: FencedLeaseClaimStatus) -> Self {
        Self {
            phase: s.phase,
            fencing_token: s.fencing_token,
            grant_time: s.grant_time.map(|t| t.0),
            lease_duration_seconds: s.lease_duration_seconds,
            queue_position: s.queue_position,
            message: s.message.map(String::into_boxed_str),
            conditions: s.conditions.into_iter().map(Into::into).collect(),
            observed_generation: s.observed_generation,
        }
    }
}

impl CachedClaimStatus {
    /// The status as the API has it.
    pub fn to_status(&self) -> FencedLeaseClaimStatus {
        FencedLeaseClaimStatus {
            phase: self.phase,
            fencing_token: self.fencing_token,
            grant_time: self.grant_time.map(MicroTime),
            lease_duration_seconds: self.lease_duration_seconds,
            queue_position: self.queue_position,
            message: self.message.as_deref().map(str::to_owned),
            conditions: self.conditions.iter().map(|c| c.to_condition()).collect(),
            observed_generation: self.observed_generation,
        }
    }

    /// Is condition `type_` there with status `status`?
    pub fn has_condition(&self, type_: &str, status: &str) -> bool {
        self.conditions
            .iter()
            .any(|c| c.type_ == type_ && c.status == status)
    }

    /// Equal to `s` but, perhaps, for when its conditions last changed; compared without
    /// building either side again (a lease's reconcile compares every claim's).
    pub fn same_but_times(&self, s: &FencedLeaseClaimStatus) -> bool {
        self.phase == s.phase
            && self.fencing_token == s.fencing_token
            && self.grant_time == s.grant_time.as_ref().map(|t| t.0)
            && self.lease_duration_seconds == s.lease_duration_seconds
            && self.queue_position == s.queue_position
            && self.message.as_deref() == s.message.as_deref()
            && self.conditions.len() == s.conditions.len()
            && self
                .conditions
                .iter()
                .zip(&s.conditions)
                .all(|(a, b)| a.same_but_time(b))
            && self.observed_generation == s.observed_generation
    }
}

impl PartialEq<FencedLeaseClaimStatus> for CachedClaimStatus {
    fn eq(&self, s: &FencedLeaseClaimStatus) -> bool {
        self.same_but_times(s)
            && self
                .conditions
                .iter()
                .zip(&s.conditions)
                .all(|(a, b)| a.last_transition_time == b.last_transition_time.0)
    }
}

/// What a claim's decisions and writes read of its metadata, with `ObjectMeta`'s names; nothing
/// else of it is kept.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClaimMeta {
    pub name: Option<String>,
    pub namespace: Option<String>,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    pub creation_timestamp: Option<Time>,
    pub deletion_timestamp: Option<Time>,
}

/// A claim as cached; of its owner references only the UID of the pod it names, the one
/// thing they are read for.
#[derive(Clone, Debug)]
pub struct CachedClaim {
    pub metadata: ClaimMeta,
    /// UID of the Pod ownerReference named like `spec.podName`, if any.
    pub pod_owner_uid: Option<Box<str>>,
    pub spec: FencedLeaseClaimSpec,
    pub status: Option<CachedClaimStatus>,
}

impl From<FencedLeaseClaim> for CachedClaim {
    fn from(claim: FencedLeaseClaim) -> Self {
        let FencedLeaseClaim {
            metadata,
            spec,
            status,
        } = claim;
        let pod_owner_uid = metadata
            .owner_references
            .into_iter()
            .flatten()
            .find(|o| {
                o.kind == "Pod" && o.api_version == "v1" && Some(&o.name) == spec.pod_name.as_ref()
            })
            .map(|o| o.uid.into_boxed_str());
        let metadata = ClaimMeta {
            name: metadata.name,
            namespace: metadata.namespace,
            uid: metadata.uid,
            resource_version: metadata.resource_version,
            creation_timestamp: metadata.creation_timestamp,
            deletion_timestamp: metadata.deletion_timestamp,
        };
        Self {
            metadata,
            pod_owner_uid,
            spec,
            status: status.map(Into::into),
        }
    }
}

impl CachedClaim {
    /// Its status as the API has it (the default when it has none).
    pub fn full_status(&self) -> FencedLeaseClaimStatus {
        self.status
            .as_ref()
            .map(CachedClaimStatus::to_status)
            .unwrap_or_default()
    }

    pub fn name_any(&self) -> String {
        self.metadata.name.clone().unwrap_or_default()
    }

    /// A reference to it, for Events.
    pub fn reference(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some(FencedLeaseClaim::api_version(&()).into_owned()),
            kind: Some(FencedLeaseClaim::kind(&()).into_owned()),
            namespace: self.metadata.namespace.clone(),
            name: self.metadata.name.clone(),
            uid: self.metadata.uid.clone(),
            resource_version: self.metadata.resource_version.clone(),
            ..Default::default()
        }
    }
}

impl Keyed for CachedClaim {
    fn namespace(&self) -> &str {
        self.metadata.namespace.as_deref().unwrap_or_default()
    }

    fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn claim() -> FencedLeaseClaim {
        serde_json::from_value(json!({
            "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLeaseClaim",
            "metadata": {
                "name": "c", "namespace": "ns", "uid": "u", "resourceVersion": "7",
                "labels": {"a": "b"}, "annotations": {"x": "y"},
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "ownerReferences": [
                    {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-0", "uid": "r"},
                    {"apiVersion": "v1", "kind": "Pod", "name": "other", "uid": "o"},
                    {"apiVersion": "v1", "kind": "Pod", "name": "web-0", "uid": "p"}
                ]
            },
            "spec": {"leaseName": "db", "holderIdentity": "web-0", "podName": "web-0",
                     "renewTime": "2026-01-01T00:00:01.000000Z"},
            "status": {
                "phase": "Granted", "fencingToken": 3, "leaseDurationSeconds": 15,
                "grantTime": "2026-01-01T00:00:02.000000Z", "message": "holds lease db",
                "conditions": [
                    {"type": "LeaseFound", "status": "True", "reason": "Found", "message": "",
                     "lastTransitionTime": "2026-01-01T00:00:02Z"},
                    {"type": "Custom", "status": "True", "reason": "Someone", "message": "m",
                     "lastTransitionTime": "2026-01-01T00:00:03Z", "observedGeneration": 2}
                ]
            }
        }))
        .unwrap()
    }

    #[test]
    fn a_cached_claim_keeps_what_decisions_read_and_the_status_whole() {
        let full = claim();
        let cached = CachedClaim::from(full.clone());
        assert_eq!(cached.pod_owner_uid.as_deref(), Some("p"));
        assert_eq!(cached.metadata.uid.as_deref(), Some("u"));
        assert_eq!(cached.metadata.resource_version.as_deref(), Some("7"));
        assert!(cached.metadata.creation_timestamp.is_some());
        assert_eq!(Keyed::namespace(&cached), "ns");
        assert_eq!(cached.spec, full.spec);
        let status = full.status.unwrap();
        assert_eq!(cached.full_status(), status);
        assert!(cached.status.as_ref().unwrap() == &status);
        assert!(matches!(
            cached.status.as_ref().unwrap().conditions[0].type_,
            Cow::Borrowed(_)
        ));
        assert!(cached.status.unwrap().has_condition("LeaseFound", "True"));
    }

    #[test]
    fn a_cached_status_differs_from_one_that_differs_in_any_field() {
        let status = claim().status.unwrap();
        let cached = CachedClaimStatus::from(status.clone());
        let mut changes: Vec<FencedLeaseClaimStatus> = vec![];
        let mut s = status.clone();
        s.message = Some("other".into());
        changes.push(s);
        let mut s = status.clone();
        s.queue_position = Some(1);
        changes.push(s);
        let mut s = status.clone();
        s.conditions[1].message = "n".into();
        changes.push(s);
        let mut s = status.clone();
        s.conditions[0].last_transition_time = Time(Timestamp::UNIX_EPOCH);
        changes.push(s);
        let mut s = status.clone();
        s.conditions.pop();
        changes.push(s);
        let mut s = status;
        s.phase = Some(ClaimPhase::Revoked);
        changes.push(s);
        for changed in changes {
            assert!(cached != changed, "{changed:?}");
        }
    }

    #[test]
    fn a_claim_without_a_pod_owner_of_its_pod_name_has_no_owner_uid() {
        let mut full = claim();
        full.spec.pod_name = Some("web-1".into());
        assert_eq!(CachedClaim::from(full).pod_owner_uid, None);
    }
}
