//! The custom resources of group `fencing.dev`, version `v1alpha1` (for the `apiVersion` of
//! an object, ask kube's `Resource` trait: `FencedLease::api_version(&())`).
//!
//! Validation lives in the generated schema (bounds, defaults, immutability and a CEL
//! transition rule that keeps `status.fencingToken` from ever going down), so the apiserver
//! enforces it for every client, not only for ours.

#![forbid(unsafe_code)]

use std::time::Duration;

mod claim;
mod crdgen;
mod lease;

pub use claim::{ClaimPhase, FencedLeaseClaim, FencedLeaseClaimSpec, FencedLeaseClaimStatus};
pub use crdgen::{CrdFile, crd_files};
pub use lease::{
    FenceSpec, FencedLease, FencedLeaseSpec, FencedLeaseStatus, FencedResource, FollowSpec,
    FollowedTerm, LeaseHolder,
};

/// Prefix of the annotation that carries a lease's token on its holder's pod.
///
/// The full key is `token.fencing.dev/<lease name>`: one key per lease, so a pod holding
/// several leases carries several tokens, and no other tool's annotation can collide with it.
pub const TOKEN_ANNOTATION_PREFIX: &str = "token.fencing.dev";

/// Label that puts a Kubernetes object under a lease's fence: `fencing.dev/lease: <lease name>`
/// (a FencedLease in the object's namespace). See `deploy/admission/fence-policy.yaml`.
pub const LEASE_LABEL: &str = "fencing.dev/lease";

/// Annotation carrying the fencing token of the last write to a fenced object:
/// `fencing.dev/token: "<token>"`, a decimal integer. The apiserver refuses a write whose token
/// is lower than the one stored on the object, or (when the lease has `spec.fenceObjects`)
/// lower than the lease's current token.
pub const TOKEN_ANNOTATION: &str = "fencing.dev/token";

/// Reason of the Warning Event a holder sends on a FencedLease when a fence or guard refused
/// its write for a stale token (`holder::refusals`); the operator counts these Events per
/// lease in `fenced_lease_write_refusals_reported_total`.
pub const WRITE_REFUSED_REASON: &str = "WriteRefused";

/// `reportingController` of those Events, from whichever library or program sends them.
pub const HOLDER_REPORTING_CONTROLLER: &str = "fencing.dev/holder";

/// The largest fencing token: 2^53 - 1. Every shipped fence compares tokens up to it exactly
/// (the admission policies as CEL integers, PostgreSQL as `bigint`, Redis as doubles, which
/// are exact only below 2^53), so the operator issues none above it and the fences refuse
/// larger ones as malformed.
pub const MAX_TOKEN: i64 = (1 << 53) - 1;

/// The largest `spec.minToken`: 2^52, which leaves 2^52 - 1 tokens above any floor.
pub const MAX_MIN_TOKEN: i64 = 1 << 52;

/// Longest lease name: the name part of an annotation key is limited to 63 characters. The
/// schema refuses longer names, for leases and for the claims that name them.
pub const MAX_LEASE_NAME_LEN: usize = 63;

/// A duration the API gives in whole seconds (`leaseDurationSeconds`), never less than one
/// second.
pub fn duration_from_seconds(seconds: i32) -> Duration {
    Duration::from_secs(u64::try_from(seconds.max(1)).unwrap_or(1))
}

/// The pod annotation key that carries the token of lease `lease_name`.
pub fn token_annotation_key(lease_name: &str) -> String {
    format!("{TOKEN_ANNOTATION_PREFIX}/{lease_name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn annotation_key_is_per_lease() {
        assert_eq!(
            token_annotation_key("db-migrate"),
            "token.fencing.dev/db-migrate"
        );
        assert_ne!(token_annotation_key("a"), token_annotation_key("b"));
    }

    #[test]
    fn durations_are_whole_seconds_and_never_zero() {
        assert_eq!(duration_from_seconds(15), Duration::from_secs(15));
        assert_eq!(duration_from_seconds(3600), Duration::from_secs(3600));
        assert_eq!(duration_from_seconds(0), Duration::from_secs(1));
        assert_eq!(duration_from_seconds(-5), Duration::from_secs(1));
    }
}
