//! The FencedLeaseClaim reconciler: only for what the lease reconciler cannot see, a claim
//! whose lease does not exist. A waiting claim is told so (condition `LeaseFound=False`, an
//! Event) and waits; a claim that held the lease is `Revoked` (its lease went without the
//! finalizer running, say), never `Pending` again. Everything else about claims follows from
//! their lease's status.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch};
use kube::runtime::events::EventType;
use serde_json::json;

use super::claims::status_params;
use super::lookup::lease_exists;
use super::{Again, write_watched};
use crate::context::Context;
use crate::core::claim_status;
use crate::error::{Error, Result};
use crate::state::claim::CachedClaim;
use fenced_lease_api::{ClaimPhase, FencedLeaseClaim};

/// The claim `key` names, reconciled if the cache still has it; when to look again.
pub async fn reconcile(ctx: &Context, key: &ClaimKey) -> Again {
    let claim = ctx.memory.claims.get(&key.0, &key.1)?;
    match reconcile_claim(&claim, ctx).await {
        Ok(again) => {
            ctx.failures.succeeded(&failure_key(&claim));
            again
        }
        Err(error) => Some(error_policy(&claim, &error, ctx)),
    }
}

/// A claim's namespace and name.
pub type ClaimKey = (String, String);

fn failure_key(claim: &CachedClaim) -> String {
    format!(
        "claim:{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        claim.name_any()
    )
}

async fn reconcile_claim(claim: &CachedClaim, ctx: &Context) -> Result<Again> {
    let ns = claim
        .metadata
        .namespace
        .clone()
        .ok_or_else(|| Error::Unexpected("FencedLeaseClaim without a namespace".into()))?;
    let lease = &claim.spec.lease_name;
    // The lease's own event brings the grant.
    if claim.metadata.deletion_timestamp.is_some()
        || lease_exists(&ctx.kube, &ctx.memory, &ns, lease).await?
    {
        return Ok(None);
    }
    let current = claim.full_status();
    let already_told = current
        .conditions
        .iter()
        .any(|c| c.type_ == "LeaseFound" && c.status == "False");
    let desired = claim_status::without_lease(&current, lease, &ns, Timestamp::now());
    let message = desired.message.clone().unwrap_or_default();
    if desired != current {
        let api: Api<FencedLeaseClaim> = Api::namespaced(ctx.kube.client.clone(), &ns);
        let patch = json!({ "status": desired.merge_patch() });
        let (name, params, patch) = (claim.name_any(), status_params(), Patch::Merge(&patch));
        let write = api.patch_status(&name, &params, &patch);
        let meta = &claim.metadata;
        let (uid, before) = (meta.uid.as_deref(), meta.resource_version.as_deref());
        write_watched(
            &ctx.kube,
            &ctx.memory,
            "write claim status",
            uid,
            before,
            write,
        )
        .await?;
    }
    let (reason, action) = match current.phase {
        Some(ClaimPhase::Granted) => ("Revoked", "Hand-over"),
        _ if !already_told => ("LeaseNotFound", "Grant"),
        _ => return Ok(None),
    };
    let on = claim.reference();
    ctx.events
        .event(&on, EventType::Warning, reason, action, message);
    Ok(None)
}

fn error_policy(claim: &CachedClaim, error: &Error, ctx: &Context) -> Duration {
    ctx.metrics.error(error.metric_label());
    let (attempt, _) = ctx
        .failures
        .failed(&failure_key(claim), error.event_reason());
    tracing::warn!(claim = %claim.name_any(), namespace = ?claim.metadata.namespace, error = %error, attempt, "claim reconcile failed");
    crate::state::failures::RETRY.pause(attempt)
}
