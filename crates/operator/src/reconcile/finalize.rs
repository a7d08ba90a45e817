//! A deleted lease: its last token recorded, its holder revoked, its name kept until its last
//! holder's term has run out, then its finalizer removed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::Api;
use tracing::{info, warn};

use super::gather::claims_of;
use super::report::report;
use super::write_status::{Outcome, write_lease_status};
use super::{Again, claims, pods, token_records};
use crate::context::Context;
use crate::error::{Result, timed};
use fenced_lease_api::{
    ClaimPhase, FencedLease, FencedLeaseClaim, FencedLeaseStatus, duration_from_seconds,
};

/// The deletion path. The last token is recorded first: that alone must succeed before the
/// lease may go. Revoking its holder, the claims' statuses and the pod annotations are best
/// effort, so a refused pod patch (say) cannot wedge the deletion of a namespace; claims and
/// pods of a lease that is gone are repaired by the claim reconciler anyway.
pub async fn finalize(
    ctx: &Context,
    api: &Api<FencedLease>,
    lease: &FencedLease,
    ns: &str,
    name: &str,
) -> Result<Again> {
    if !token_records::has_finalizer(lease) {
        return Ok(None);
    }
    let status = lease.status.clone().unwrap_or_default();
    let last = status.fencing_token.max(lease.spec.min_token);
    token_records::record(ctx, ns, name, last).await?;

    // The finalizer is removed with the resourceVersion of the last write (the revoking status
    // write, if any): the one read would always meet a 409, and a retry after backoff.
    let mut latest: Option<FencedLease> = None;
    let revoked = async {
        if let Outcome::Written(outcome) = write_lease_status(ctx, api, lease.clone(), None).await?
        {
            let (before, written, plan, claims) = *outcome;
            report(&ctx.events, &ctx.metrics, &written, &before, &plan);
            let status = written.status.clone().unwrap_or_default();
            latest = Some(written);
            claims::repair(ctx, &status, &plan, claims, ns, name).await?;
        }
        pods::repair_annotations(&ctx.kube, &ctx.memory, lease, ns, name).await
    };
    if let Err(error) = revoked.await {
        warn!(lease = %name, namespace = %ns, %error, "could not revoke every claim and pod annotation of a deleted lease; the claim reconciler finishes it");
    }
    if let Some(left) = holders_may_believe(ctx, lease, &status, ns, name).await? {
        info!(lease = %name, namespace = %ns, wait_ms = left.as_millis() as u64, "lease deleted; its name is kept until its last holder's term has run out");
        return Ok(Some(left));
    }
    token_records::remove_finalizer(
        &ctx.kube,
        &ctx.memory,
        api,
        latest.as_ref().unwrap_or(lease),
    )
    .await?;
    ctx.metrics.transitions.forget(ns, name);
    token_records::forget_read_ahead(ctx, lease);
    info!(lease = %name, namespace = %ns, token = last, "lease deleted; last token recorded");
    Ok(None)
}

/// How much longer a holder of a lease being deleted may still count itself the holder, if
/// at all. Revoking it is not enough: a holder cut off from the apiserver does not hear of it,
/// and believes it holds until its own safe deadline. Were the finalizer removed at once, a
/// lease created again under the same name could be granted meanwhile: two holders of one
/// name (I6; the tokens still grow, so fences refuse the old holder's writes, I1). So the
/// name is kept until the term has run out since the operator last saw the heartbeat of
/// every claim of the lease that was granted (`Granted` or `Revoked`, still present). As for
/// an expiry (I9), the holder's deadline counts from the send time of its last accepted renew,
/// which came before the operator saw it; a `Revoked` claim's heartbeat is frozen by the CRD.
/// A claim deleted by its holder ends the wait at once (as a release does). The holder the
/// status names is read from the API when the cache does not have its claim (not yet, or no
/// longer), so that neither a lagging cache nor a claim that is gone decides.
async fn holders_may_believe(
    ctx: &Context,
    lease: &FencedLease,
    status: &FencedLeaseStatus,
    ns: &str,
    name: &str,
) -> Result<Option<Duration>> {
    let lease_term = lease
        .spec
        .lease_duration()
        .max(status.term_duration().unwrap_or_default());
    let mut claims = claims_of(&ctx.memory, ns, name);
    // A followed Lease's holder (no claim) is told by its own leader election; a lease
    // created again under this name continues its tokens from the record.
    if let Some(holder) = status.holder.as_ref().filter(|h| !h.claim.is_empty())
        && !claims
            .iter()
            .any(|c| c.metadata.uid.as_deref() == Some(holder.claim_uid.as_str()))
    {
        let api: Api<FencedLeaseClaim> = Api::namespaced(ctx.kube.client.clone(), ns);
        let read = match timed(
            "read holder claim of a deleted lease",
            ctx.kube.timeout,
            api.get_opt(&holder.claim),
        )
        .await
        {
            Ok(read) => read,
            // Not a claim's NotFound but the resource's own 404: the claims' CRD is gone, and
            // every claim with it. Gone, as above: otherwise the leases' CRD can never go.
            Err(e) if e.is_not_found() => None,
            Err(e) => return Err(e),
        };
        claims.extend(
            read.filter(|c| c.metadata.uid.as_deref() == Some(holder.claim_uid.as_str()))
                .map(|c| Arc::new(c.into())),
        );
    }
    let now = Instant::now();
    let mut until: Option<Instant> = None;
    for claim in &claims {
        let granted = claim
            .status
            .as_ref()
            .is_some_and(|s| matches!(s.phase, Some(ClaimPhase::Granted | ClaimPhase::Revoked)));
        let (Some(uid), true) = (claim.metadata.uid.as_deref(), granted) else {
            continue;
        };
        if claim.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let term = claim
            .status
            .as_ref()
            .and_then(|s| s.lease_duration_seconds)
            .map_or(lease_term, |d| duration_from_seconds(d).max(lease_term));
        let end = ctx.memory.heartbeats.last_change(uid, now) + term;
        until = until.max(Some(end));
    }
    Ok(until
        .filter(|t| *t > now)
        .map(|t| t.saturating_duration_since(now)))
}
