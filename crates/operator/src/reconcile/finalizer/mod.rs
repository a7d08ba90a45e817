//! The operator's finalizer on a FencedLease, its whole cycle. Tokens outlive their lease
//! object (I1): before a lease goes, the last token issued under its name is recorded, and a
//! lease created again under that name starts above it.
//!
//! 1. **Add** ([`ensure`]): no token is issued before the finalizer that will record it is in
//!    place. It is added with the label [`FOLLOWS_LABEL`] ([`metadata`]), and the token record
//!    of the lease's name is read ahead of its first grant ([`ahead`]).
//! 2. **Record ahead**: a token above the wall clock is recorded before it is issued
//!    ([`records::record_ahead`], called by the grant), where a stripped finalizer cannot take
//!    it.
//! 3. **Record the last token** ([`cleanup`], on deletion): the one step that must succeed
//!    before the lease may go ([`records`]).
//! 4. **Clean up**: its holder revoked, its claims' statuses and pod annotations repaired, best
//!    effort, so a refused pod patch (say) cannot wedge the deletion of a namespace; claims and
//!    pods of a lease that is gone are repaired by the claim reconciler anyway.
//! 5. **Wait** until its last holder's term has run out ([`holders`]).
//! 6. **Remove** the finalizer, and forget the lease.
//!
//! Each step may run again, and cleanup is safe even if the lease never issued a token: a
//! record is only ever raised (to `max(fencingToken, minToken)`), and a finalizer already
//! gone is not removed again.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use kube::api::Api;
use tracing::{info, warn};

use super::report::report;
use super::write_status::{Outcome, write_lease_status};
use super::{Again, claims, pods};
use crate::context::Context;
use crate::error::Result;
use fenced_lease_api::FencedLease;

pub mod ahead;
pub mod holders;
pub mod metadata;
pub mod records;

pub use metadata::{FOLLOWS_LABEL, follows_label};

/// Finalizer that records the lease's last token before it is deleted.
pub const FINALIZER: &str = "fencing.dev/token-high-water-mark";

pub fn has_finalizer(lease: &FencedLease) -> bool {
    lease
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == FINALIZER)
}

/// The lease with the operator's finalizer, added if it is missing (and its label
/// [`FOLLOWS_LABEL`] set as `spec.follow` says), or when to look again. The lease as written
/// carries it, so the grant goes on in this same reconcile. Its token record is read first,
/// ahead of the first claim's grant: the lease as seen with its finalizer has had its record
/// read.
pub async fn ensure(
    ctx: &Context,
    api: &Api<FencedLease>,
    lease: Arc<FencedLease>,
) -> Result<ControlFlow<Again, Arc<FencedLease>>> {
    if metadata::settled(&lease) {
        return Ok(ControlFlow::Continue(lease));
    }
    ahead::read(ctx, &lease).await;
    match metadata::add_finalizer(&ctx.kube, &ctx.memory, api, &lease).await {
        // Our cached copy is older than the lease: its update event is on its way.
        Err(e) if e.is_conflict() => Ok(ControlFlow::Break(Some(Duration::from_millis(100)))),
        Ok(Some(mut written)) if has_finalizer(&written) => {
            written.metadata.managed_fields = None;
            Ok(ControlFlow::Continue(Arc::new(written)))
        }
        result => {
            // Gone before its finalizer: nothing will be granted.
            ahead::forget(ctx, &lease);
            result?;
            Ok(ControlFlow::Break(None))
        }
    }
}

/// The deletion path (steps 3 to 6 of the module's list): the last token recorded, the
/// holder revoked, the name kept until its last holder's term has run out, then the
/// finalizer removed.
pub async fn cleanup(
    ctx: &Context,
    api: &Api<FencedLease>,
    lease: &FencedLease,
    ns: &str,
    name: &str,
) -> Result<Again> {
    if !has_finalizer(lease) {
        return Ok(None);
    }
    let status = lease.status.clone().unwrap_or_default();
    let last = status.fencing_token.max(lease.spec.min_token);
    records::record(ctx, ns, name, last).await?;
    let latest = revoke(ctx, api, lease, ns, name).await;
    if let Some(left) = holders::may_believe(ctx, lease, &status, ns, name).await? {
        info!(lease = %name, namespace = %ns, wait_ms = left.as_millis() as u64, "lease deleted; its name is kept until its last holder's term has run out");
        return Ok(Some(left));
    }
    // With the resourceVersion of the last write (the revoking status write, if any): the
    // lease's as read would always meet a 409, and a retry after backoff.
    let latest = latest.as_ref().unwrap_or(lease);
    metadata::remove_finalizer(&ctx.kube, &ctx.memory, api, latest).await?;
    ctx.metrics.transitions.forget(ns, name);
    ahead::forget(ctx, lease);
    info!(lease = %name, namespace = %ns, token = last, "lease deleted; last token recorded");
    Ok(None)
}

/// Revokes the holder of deleted lease `ns/name` and brings its claims and pod annotations in
/// line, best effort (a failure is logged: the claim reconciler finishes it); the lease as
/// written, if its status was.
async fn revoke(
    ctx: &Context,
    api: &Api<FencedLease>,
    lease: &FencedLease,
    ns: &str,
    name: &str,
) -> Option<FencedLease> {
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
    latest
}

#[cfg(test)]
mod tests;
