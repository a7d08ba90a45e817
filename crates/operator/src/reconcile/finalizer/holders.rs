//! How long the name of a lease being deleted is kept for its last holder. Revoking the holder
//! is not enough: a holder cut off from the apiserver does not hear of it, and believes it
//! holds until its own safe deadline. Were the finalizer removed at once, a lease created again
//! under the same name could be granted meanwhile: two holders of one name (I6; the tokens
//! still grow, so fences refuse the old holder's writes, I1).

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::Api;

use crate::context::Context;
use crate::error::{Result, timed};
use crate::reconcile::gather::claims_of;
use crate::state::{CachedClaim, Memory};
use fenced_lease_api::{
    ClaimPhase, FencedLease, FencedLeaseClaim, FencedLeaseStatus, duration_from_seconds,
};

/// How much longer a holder of a lease being deleted may still count itself the holder, if
/// at all: the name is kept until the term has run out since the operator last saw the
/// heartbeat of every claim of the lease that was granted (`Granted` or `Revoked`, still
/// present). As for an expiry (I9), the holder's deadline counts from the send time of its
/// last accepted renew, which came before the operator saw it; a `Revoked` claim's heartbeat is
/// frozen by the CRD. A claim deleted by its holder ends the wait at once (as a release does).
pub async fn may_believe(
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
    let claims = with_holder(ctx, status, claims_of(&ctx.memory, ns, name), ns).await?;
    Ok(term_left(&ctx.memory, &claims, lease_term, Instant::now()))
}

/// `claims` (the cache's) with the holder the status names, read from the API when the cache
/// does not have its claim (not yet, or no longer), so that neither a lagging cache nor a
/// claim that is gone decides.
async fn with_holder(
    ctx: &Context,
    status: &FencedLeaseStatus,
    mut claims: Vec<Arc<CachedClaim>>,
    ns: &str,
) -> Result<Vec<Arc<CachedClaim>>> {
    // A followed Lease's holder (no claim) is told by its own leader election; a lease
    // created again under this name continues its tokens from the record.
    let Some(holder) = status.holder.as_ref().filter(|h| !h.claim.is_empty()) else {
        return Ok(claims);
    };
    let uid = holder.claim_uid.as_str();
    if claims
        .iter()
        .any(|c| c.metadata.uid.as_deref() == Some(uid))
    {
        return Ok(claims);
    }
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
        read.filter(|c| c.metadata.uid.as_deref() == Some(uid))
            .map(|c| Arc::new(c.into())),
    );
    Ok(claims)
}

/// How long after `now` the last term of the granted claims among `claims` runs out, if it has
/// not yet: each is `lease_term` (or the longer term it was granted) after the operator last
/// saw its heartbeat change.
fn term_left(
    memory: &Memory,
    claims: &[Arc<CachedClaim>],
    lease_term: Duration,
    now: Instant,
) -> Option<Duration> {
    let mut until: Option<Instant> = None;
    for claim in claims {
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
        let end = memory.heartbeats.last_change(uid, now) + term;
        until = until.max(Some(end));
    }
    until
        .filter(|t| *t > now)
        .map(|t| t.saturating_duration_since(now))
}
