//! The FencedLease reconciler. A lease's trip through it:
//!
//! 1. A deleted lease goes to its [`finalizer`]'s cleanup: its last token recorded, its holder
//!    revoked, its finalizer removed once its last holder's term has run out.
//! 2. A cached copy older than the operator's own last write waits for the watch to catch up.
//! 3. The finalizer is put in place before any token is issued ([`finalizer::ensure`]).
//! 4. The fence must be in force before anyone is granted (I12).
//! 5. The status is decided on the caches and written (the linearization point: one write
//!    carrying the resourceVersion it was decided on), after whatever the caches alone may not
//!    decide has been read or made final (see [`crate::core::step`]).
//! 6. The claims' statuses and the pods' token annotations are repaired from it.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use tracing::warn;

use super::report::report;
use super::write_status::{Outcome, write_lease_status};
use super::{Again, claims, finalizer, pods, write_watched};
use crate::admission::Check;
use crate::context::{Context, Kube};
use crate::core::status;
use crate::error::{Error, Result, truncate};
use crate::names::LeaseKey;
use crate::state::Memory;
use crate::state::failures::RETRY;
use fenced_lease_api::FencedLease;

/// Look again this soon at a lease whose cached copy lags the operator's own write.
const STALE_RETRY: Duration = Duration::from_secs(2);

pub async fn reconcile(lease: Arc<FencedLease>, ctx: Arc<Context>) -> Result<Again> {
    let started = Instant::now();
    let result = reconcile_lease(lease.clone(), &ctx).await;
    ctx.metrics
        .reconcile_duration
        .observe(started.elapsed().as_secs_f64());
    if result.is_ok() {
        ctx.failures.succeeded(&LeaseKey::of(&lease).to_string());
    }
    result
}

/// Failed reconciles are retried with exponential backoff; the error is counted, logged,
/// and reported by a Warning Event when its cause is new, and again at the 2nd, 4th, 8th...
/// failure in a row (an Event series whose count shows it goes on), never once per retry.
pub fn error_policy(lease: Arc<FencedLease>, error: &Error, ctx: Arc<Context>) -> Again {
    ctx.metrics.error(error.metric_label());
    let key = LeaseKey::of(&lease).to_string();
    let (attempt, new_cause) = ctx.failures.failed(&key, error.event_reason());
    if error.is_conflict() {
        // Someone else moved first; deciding again on fresh state is routine.
        tracing::debug!(lease = %lease.name_any(), namespace = ?lease.namespace(), error = %error, "reconcile conflicted");
    } else {
        warn!(lease = %lease.name_any(), namespace = ?lease.namespace(), error = %error, attempt, "reconcile failed");
        if new_cause || attempt.is_power_of_two() {
            let reference = lease.object_ref(&());
            let note = format!("{error}");
            ctx.events.event(
                &reference,
                EventType::Warning,
                error.event_reason(),
                "Reconcile",
                note,
            );
        }
    }
    Some(RETRY.pause(attempt))
}

async fn reconcile_lease(lease: Arc<FencedLease>, ctx: &Context) -> Result<Again> {
    let ns = lease
        .namespace()
        .ok_or_else(|| Error::Unexpected("FencedLease without a namespace".into()))?;
    let name = lease.name_any();
    let api: Api<FencedLease> = Api::namespaced(ctx.kube.client.clone(), &ns);

    if lease.metadata.deletion_timestamp.is_some() {
        return finalizer::cleanup(ctx, &api, &lease, &ns, &name).await;
    }
    if ctx.memory.written.is_superseded(
        lease.metadata.uid.as_deref(),
        lease.metadata.resource_version.as_deref(),
    ) {
        // The cache has not shown this operator's own last write of the lease yet: deciding
        // on this copy would repeat it (a 409 and a read). Its watch event brings the next
        // reconcile; the requeue is only a safety net.
        return Ok(Some(STALE_RETRY));
    }
    let lease = match finalizer::ensure(ctx, &api, lease).await? {
        ControlFlow::Continue(lease) => lease,
        ControlFlow::Break(again) => return Ok(again),
    };

    let fenced = match fence(ctx, &lease) {
        ControlFlow::Continue(fenced) => fenced,
        ControlFlow::Break(again) => return Ok(again),
    };
    let unfenced = fenced
        .as_ref()
        .err()
        .map(|e| truncate(&e.to_string(), 1024).to_string());

    let written = match write_lease_status(ctx, &api, (*lease).clone(), unfenced.as_deref()).await {
        Err(error @ Error::TokenRecord { .. }) => {
            degrade(&ctx.kube, &ctx.memory, &api, &lease, &error).await;
            return Err(error);
        }
        written => written?,
    };
    let (before, lease, plan, claims) = match written {
        Outcome::Written(outcome) => *outcome,
        Outcome::Gone => return Ok(None),
        Outcome::Requeue => return Ok(Some(Duration::from_millis(100))),
    };
    report(&ctx.events, &ctx.metrics, &lease, &before, &plan);

    let status = lease.status.clone().unwrap_or_default();
    claims::repair(ctx, &status, &plan, claims, &ns, &name).await?;
    pods::repair_annotations(&ctx.kube, &ctx.memory, &lease, &ns, &name).await?;
    fenced?;

    // Next at the latest: the holder's deadline, a waiter's, or the resync.
    let idle = Instant::now() + ctx.resync_after();
    let wake = plan.wake_at.map_or(idle, |at| at.min(idle));
    Ok(Some(wake.saturating_duration_since(Instant::now())))
}

/// Whether the lease's fence is in force, or when to look again. The fence comes before any
/// grant: a lease whose fence is not in force grants no one (I12: fail closed, condition
/// Held=False FenceNotInForce); its holder keeps its term and expiries and releases go on. The
/// error is returned once they are done (Event, metric, retry). One whose kinds slot is being
/// updated, or was just updated, is decided again once the apiserver has it.
fn fence(ctx: &Context, lease: &FencedLease) -> ControlFlow<Again, Result<()>> {
    ControlFlow::Continue(match ctx.admission.check(lease) {
        Check::InForce => Ok(()),
        Check::Settling(in_force) => {
            return ControlFlow::Break(Some(in_force.saturating_duration_since(Instant::now())));
        }
        Check::Pending => return ControlFlow::Break(None),
        Check::NotInForce(why) => Err(Error::Fence(Box::new(Error::FenceGap(why)))),
    })
}

/// Says on the lease, with condition `Degraded`, why no token can be issued (best effort: the
/// error is also logged and reported as an Event by the error policy).
async fn degrade(
    kube: &Kube,
    memory: &Memory,
    api: &Api<FencedLease>,
    lease: &FencedLease,
    error: &Error,
) {
    let mut update = lease.clone();
    update.metadata.managed_fields = None;
    let status = update.status.get_or_insert_with(Default::default);
    let message = error.to_string();
    status::set_condition(
        &mut status.conditions,
        "Degraded",
        "True",
        error.event_reason(),
        truncate(&message, 1024),
        lease.metadata.generation,
        Timestamp::now(),
    );
    if update.status == lease.status {
        return;
    }
    let name = lease.name_any();
    let params = PostParams::default();
    let write = api.replace_status(&name, &params, &update);
    let meta = &lease.metadata;
    let (uid, before) = (meta.uid.as_deref(), meta.resource_version.as_deref());
    if let Err(e) = write_watched(kube, memory, "write lease condition", uid, before, write).await {
        tracing::debug!(lease = %name, error = %e, "could not set the Degraded condition");
    }
}

#[cfg(test)]
mod tests;
