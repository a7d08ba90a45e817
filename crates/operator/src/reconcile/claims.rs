//! The claims of a lease brought in line with its status.

use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tokio::time::Instant;

use super::gather::newest_grant;
use super::{pods, write_watched};
use crate::context::{Context, Kube};
use crate::core::claim_status::ClaimStatuses;
use crate::core::decide::Plan;
use crate::core::transitions::{self, ClaimWas};
use crate::error::Result;
use crate::names::MANAGER;
use crate::state::CachedClaim;
use crate::state::Memory;
use crate::state::positions::{self, PositionWrite};
use fenced_lease_api::{ClaimPhase, FencedLeaseClaim, FencedLeaseClaimStatus, FencedLeaseStatus};

/// Brings every claim of the lease in line with the lease status. First the claims a grant
/// changes (the holder that ends, any other claim still shown `Granted`, then the new
/// holder, so no moment shows two claims `Granted`), before the rest of the queue is even
/// looked at: a hand-over's own writes do not wait for a long queue to be compared. Then the
/// others; waiting claims that only moved up the queue are left to the position writer
/// ([`state::positions`](crate::state::positions)): a hand-over writes O(1) claims
/// however long the queue behind it.
pub async fn repair(
    ctx: &Context,
    status: &FencedLeaseStatus,
    plan: &Plan,
    claims: Vec<Arc<CachedClaim>>,
    ns: &str,
    name: &str,
) -> Result<()> {
    let api: Api<FencedLeaseClaim> = Api::namespaced(ctx.kube.client.clone(), ns);
    let (grant, rest): (Vec<_>, Vec<_>) = claims
        .into_iter()
        .partition(|c| on_grant_path(c, status, plan));
    write_all(
        ctx,
        &api,
        to_write(&ctx.memory, status, plan, grant, name),
        (ns, name),
    )
    .await?;
    let (now, moves): (Vec<_>, Vec<_>) = to_write(&ctx.memory, status, plan, rest, name)
        .into_iter()
        .partition(|(claim, desired)| !positions::only_moved(claim.status.as_ref(), desired));
    let moves = moves
        .into_iter()
        .map(|(claim, status)| PositionWrite {
            claim: claim.name_any(),
            status,
        })
        .collect();
    ctx.memory.positions.leave(ns, name, moves, Instant::now());
    write_all(ctx, &api, now, (ns, name)).await
}

/// Whether a claim's status changes with the grant itself: the holder, the holder that
/// ended, or a claim still shown `Granted`.
fn on_grant_path(claim: &CachedClaim, status: &FencedLeaseStatus, plan: &Plan) -> bool {
    let uid = claim.metadata.uid.as_deref();
    uid.is_some_and(|uid| {
        status.holder.as_ref().is_some_and(|h| h.claim_uid == uid)
            || plan.ended.as_ref().is_some_and(|e| e.uid == uid)
    }) || claim
        .status
        .as_ref()
        .is_some_and(|s| s.phase == Some(ClaimPhase::Granted))
}

/// Writes each claim's status in turn, with the Events its change calls for.
async fn write_all(
    ctx: &Context,
    api: &Api<FencedLeaseClaim>,
    writes: Vec<(Arc<CachedClaim>, FencedLeaseClaimStatus)>,
    (ns, name): (&str, &str),
) -> Result<()> {
    for (claim, desired) in writes {
        let was = ClaimWas {
            phase: claim.status.as_ref().and_then(|s| s.phase),
            pod_missing: claim
                .status
                .as_ref()
                .is_some_and(|s| s.has_condition("PodFound", "False")),
        };
        if !write(&ctx.kube, &ctx.memory, api, &claim, &desired, Over::Any).await? {
            continue;
        }
        let pod = claim.spec.pod_name.as_deref();
        for notice in transitions::claim_notices(was, &desired, ns, name, pod) {
            let (type_, reason, action) = (notice.type_, notice.reason, notice.action);
            ctx.events
                .event(&claim.reference(), type_, reason, action, notice.note);
        }
    }
    Ok(())
}

/// Those of `claims` whose status differs from what the lease status implies, with that
/// status, in the order to write them.
fn to_write(
    memory: &Memory,
    status: &FencedLeaseStatus,
    plan: &Plan,
    claims: Vec<Arc<CachedClaim>>,
    name: &str,
) -> Vec<(Arc<CachedClaim>, FencedLeaseClaimStatus)> {
    let holder = status.holder.as_ref();
    let mut statuses = ClaimStatuses::new(name, status, plan, Timestamp::now());
    let mut writes: Vec<_> = claims
        .into_iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        // A claim whose cached copy this operator has already written over: its watch event
        // is on its way and reconciles the lease again; writing now would repeat.
        .filter(|c| {
            !memory.written.is_superseded(
                c.metadata.uid.as_deref(),
                c.metadata.resource_version.as_deref(),
            )
        })
        // A claim granted a token above this status's was granted after it was written (by
        // another replica, between our write and this repair): this status is stale for it,
        // and must not revoke it.
        .filter(|c| newest_grant(std::slice::from_ref(c)) <= status.fencing_token)
        .filter_map(|c| {
            let held = holder.filter(|h| c.metadata.uid.as_deref() == Some(h.claim_uid.as_str()));
            let granted_to = held.and_then(|h| h.pod_uid.as_deref());
            let presence = pods::presence(&c, &memory.pods, granted_to);
            statuses.change(&c, presence).map(|desired| (c, desired))
        })
        .collect();
    // Those that lose the lease first, so no moment shows two claims Granted; then the new
    // holder, so a hand-over does not wait for the queue's position updates; then the queue.
    writes.sort_by_key(|(_, s)| match s.phase {
        Some(ClaimPhase::Expired | ClaimPhase::Revoked) => 0,
        Some(ClaimPhase::Granted) => 1,
        _ => 2,
    });
    writes
}

/// What a claim status write may replace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Over {
    /// Whatever is stored: the status follows from the lease status just written.
    Any,
    /// Only the version cached (else a conflict): a status decided a while ago.
    Cached,
}

/// How the operator writes a claim's status: a JSON merge patch that names every field
/// ([`FencedLeaseClaimStatus::merge_patch`]), under the operator's field manager.
pub fn status_params() -> PatchParams {
    PatchParams {
        field_manager: Some(MANAGER.into()),
        ..PatchParams::default()
    }
}

/// Writes a claim's status; whether it was written (a claim gone, or already final, is not).
pub async fn write(
    kube: &Kube,
    memory: &Memory,
    api: &Api<FencedLeaseClaim>,
    claim: &CachedClaim,
    desired: &FencedLeaseClaimStatus,
    over: Over,
) -> Result<bool> {
    let claim_name = claim.name_any();
    let mut patch = json!({ "status": desired.merge_patch() });
    if over == Over::Cached {
        patch["metadata"] = json!({"resourceVersion": claim.metadata.resource_version});
    }
    let (params, patch) = (status_params(), Patch::Merge(&patch));
    let write = api.patch_status(&claim_name, &params, &patch);
    let meta = &claim.metadata;
    let (uid, before) = (meta.uid.as_deref(), meta.resource_version.as_deref());
    match write_watched(kube, memory, "write claim status", uid, before, write).await {
        Ok(_) => Ok(true),
        Err(e) if e.is_not_found() => Ok(false),
        // The claim reached a final phase the cache has not shown us yet (Expired and
        // Revoked are final; the CRD refuses to leave them): nothing to repair.
        Err(e) if e.is_invalid() => {
            tracing::debug!(claim = %claim_name, error = %e, "claim status not repaired");
            Ok(false)
        }
        Err(e) => Err(e),
    }
}
