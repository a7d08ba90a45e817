//! The finalizer on the lease object: added with the label [`FOLLOWS_LABEL`] in one patch, and
//! removed; each write guarded by the lease's resourceVersion, so no one else's finalizer or
//! label is lost.

use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::{FINALIZER, has_finalizer};
use crate::context::Kube;
use crate::error::Result;
use crate::reconcile::write_watched;
use crate::state::Memory;
use fenced_lease_api::FencedLease;

/// Adds the finalizer if it is missing and sets the label [`FOLLOWS_LABEL`] as
/// [`follows_label`] says, in one patch guarded by the lease's resourceVersion so no other
/// finalizer is lost; the lease as written, `None` when it is gone.
pub async fn add_finalizer(
    kube: &Kube,
    memory: &Memory,
    api: &Api<FencedLease>,
    lease: &FencedLease,
) -> Result<Option<FencedLease>> {
    let mut finalizers = lease.metadata.finalizers.clone().unwrap_or_default();
    if !has_finalizer(lease) {
        finalizers.push(FINALIZER.to_string());
    }
    let metadata = json!({
        "finalizers": finalizers,
        "labels": { FOLLOWS_LABEL: follows_label(lease) },
    });
    patch_metadata(kube, memory, api, lease, metadata).await
}

/// Label of a FencedLease that follows a coordination Lease (`spec.follow`), set and removed
/// by the operator: the admission policy that refuses claims of such a lease
/// (deploy/admission/follow.yaml) asks only the leases carrying it, not every lease of the
/// claim's namespace (which made each claim create cost a policy evaluation per lease there).
pub const FOLLOWS_LABEL: &str = "fencing.dev/follows";

/// The value [`FOLLOWS_LABEL`] should have on `lease` (`None`: absent).
pub fn follows_label(lease: &FencedLease) -> Option<&'static str> {
    lease.spec.follow.as_ref().map(|_| "true")
}

/// The lease's finalizer and label are as [`add_finalizer`] sets them.
pub fn settled(lease: &FencedLease) -> bool {
    has_finalizer(lease)
        && lease
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(FOLLOWS_LABEL))
            .map(String::as_str)
            == follows_label(lease)
}

/// Removes the finalizer (idempotent), guarded by the lease's resourceVersion.
pub async fn remove_finalizer(
    kube: &Kube,
    memory: &Memory,
    api: &Api<FencedLease>,
    lease: &FencedLease,
) -> Result<()> {
    if !has_finalizer(lease) {
        return Ok(());
    }
    let finalizers: Vec<String> = lease
        .metadata
        .finalizers
        .iter()
        .flatten()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    patch_metadata(
        kube,
        memory,
        api,
        lease,
        json!({ "finalizers": finalizers }),
    )
    .await
    .map(drop)
}

/// Merge-patches `metadata` (an object of metadata fields) into the lease, guarded by its
/// resourceVersion.
async fn patch_metadata(
    kube: &Kube,
    memory: &Memory,
    api: &Api<FencedLease>,
    lease: &FencedLease,
    mut metadata: serde_json::Value,
) -> Result<Option<FencedLease>> {
    let name = lease.metadata.name.clone().unwrap_or_default();
    metadata["resourceVersion"] = json!(lease.metadata.resource_version);
    let patch = json!({ "metadata": metadata });
    let (params, patch) = (PatchParams::default(), Patch::Merge(&patch));
    let write = api.patch(&name, &params, &patch);
    let meta = &lease.metadata;
    let (uid, before) = (meta.uid.as_deref(), meta.resource_version.as_deref());
    match write_watched(kube, memory, "patch lease finalizers", uid, before, write).await {
        Ok(written) => Ok(Some(written)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}
