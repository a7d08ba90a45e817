//! The FencedLease reconciler: gather the lease, its claims and their pods from the caches,
//! [`decide`], write the lease status (the linearization point: one write carrying the
//! resourceVersion it was decided on), then repair claim statuses and pod annotations from it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::{info, warn};

use super::context::{Context, claim_reference};
use super::decide::{ClaimView, EndReason, LeaseView, Plan, PodPresence, decide};
use super::error::{Error, Result, timed};
use super::metrics::Transition;
use super::{high_water, pods, status};
use crate::api::{ClaimPhase, FencedLease, FencedLeaseClaim, FencedLeaseStatus};

/// Field manager of the operator's claim status writes.
pub const MANAGER: &str = "fenced-lease-operator";
/// Attempts at the lease status write before giving up this round (each after a re-read).
const MAX_CONFLICTS: usize = 5;

pub async fn reconcile(lease: Arc<FencedLease>, ctx: Arc<Context>) -> Result<Action> {
    if !ctx.is_synced() {
        return Ok(Action::requeue(Duration::from_millis(200)));
    }
    let started = Instant::now();
    let result = reconcile_lease(lease, &ctx).await;
    ctx.metrics
        .reconcile_duration
        .observe(started.elapsed().as_secs_f64());
    result
}

/// Failed reconciles are retried with a short delay; the error is counted and reported.
pub fn error_policy(lease: Arc<FencedLease>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.error(error.metric_label());
    if error.is_conflict() {
        // Someone else moved first; deciding again on fresh state is routine.
        tracing::debug!(lease = %lease.name_any(), namespace = ?lease.namespace(), error = %error, "reconcile conflicted");
    } else {
        warn!(lease = %lease.name_any(), namespace = ?lease.namespace(), error = %error, "reconcile failed");
        let ctx = ctx.clone();
        let reference = lease.object_ref(&());
        let note = format!("{error}");
        let reason = error.event_reason();
        tokio::spawn(async move {
            ctx.event(&reference, EventType::Warning, reason, "Reconcile", note)
                .await
        });
    }
    Action::requeue(Duration::from_millis(500))
}

async fn reconcile_lease(lease: Arc<FencedLease>, ctx: &Context) -> Result<Action> {
    let ns = lease
        .namespace()
        .ok_or_else(|| Error::Unexpected("FencedLease without a namespace".into()))?;
    let name = lease.name_any();
    let api: Api<FencedLease> = Api::namespaced(ctx.client.clone(), &ns);
    let deleting = lease.metadata.deletion_timestamp.is_some();

    if !deleting && !high_water::has_finalizer(&lease) {
        // No token is issued before the finalizer that will record it is in place.
        match high_water::add_finalizer(ctx, &api, &lease).await {
            // Our cached copy is older than the lease: its update event is on its way.
            Err(e) if e.is_conflict() => return Ok(Action::requeue(Duration::from_millis(100))),
            result => result?,
        }
        return Ok(Action::await_change());
    }
    let Some((before, lease, plan)) =
        write_lease_status(ctx, &api, (*lease).clone(), &ns, &name).await?
    else {
        return Ok(Action::await_change()); // deleted meanwhile
    };
    let now = Instant::now();
    if let Some(grant) = &plan.grant {
        ctx.heartbeats.restart_term(&grant.uid, now);
    }
    report_transitions(ctx, &lease, &before, &plan, &ns, &name).await;

    let status = lease.status.clone().unwrap_or_default();
    repair_claims(ctx, &status, &plan, &ns, &name).await?;
    pods::repair_annotations(ctx, &lease, &ns, &name).await?;
    ctx.metrics.lease_state(
        &ns,
        &name,
        status.holder.is_some(),
        i64::from(status.waiting),
    );

    // The admission binding that fences the lease's objects, after the grant path so that a
    // failure here never holds up a grant or an expiry; deleted before the finalizer goes.
    super::fence_binding::sync(ctx, &lease).await?;

    if deleting {
        high_water::record(ctx, &ns, &name, status.fencing_token).await?;
        high_water::remove_finalizer(ctx, &api, &lease).await?;
        ctx.metrics.forget_lease(&ns, &name);
        info!(lease = %name, namespace = %ns, token = status.fencing_token, "lease deleted; last token recorded");
        return Ok(Action::await_change());
    }

    let wake_at = match &plan.grant {
        Some(_) => Some(now + lease_duration(&lease)),
        None => plan.wake_at,
    };
    Ok(match wake_at {
        Some(at) => Action::requeue(at.saturating_duration_since(Instant::now())),
        None => Action::await_change(),
    })
}

fn lease_duration(lease: &FencedLease) -> Duration {
    Duration::from_secs(
        u64::try_from(lease.spec.lease_duration_seconds)
            .unwrap_or(1)
            .max(1),
    )
}

fn claims_of(ctx: &Context, ns: &str, lease: &str) -> Vec<Arc<FencedLeaseClaim>> {
    ctx.claims
        .state_filter(|c| c.metadata.namespace.as_deref() == Some(ns) && c.spec.lease_name == lease)
}

/// Decides and writes the lease status; on 409 re-reads the lease and decides again.
/// Returns the status the decision started from, the lease as written (or as read, when
/// nothing changed) and the plan it carries; `None` when the lease is gone.
async fn write_lease_status(
    ctx: &Context,
    api: &Api<FencedLease>,
    mut lease: FencedLease,
    ns: &str,
    name: &str,
) -> Result<Option<(FencedLeaseStatus, FencedLease, Plan)>> {
    for _ in 0..MAX_CONFLICTS {
        let claims = claims_of(ctx, ns, name);
        let current = lease.status.clone().unwrap_or_default();
        let now = Instant::now();
        let duration = lease_duration(&lease);
        let mut views: Vec<ClaimView> = claims
            .iter()
            .map(|c| claim_view(ctx, c, pods::presence(c, &ctx.pods), now, duration))
            .collect();
        let mut view = LeaseView {
            holder_uid: current.holder.as_ref().map(|h| h.claim_uid.clone()),
            last_token: current.fencing_token,
            high_water_mark: 0,
            min_token: lease.spec.min_token,
            deleting: lease.metadata.deletion_timestamp.is_some(),
        };
        let mut plan = decide(&view, &views, now);
        if let Some(confirmed) = confirm_holder(ctx, ns, &current, &plan, now, duration).await? {
            // The cache was behind the API (another replica granted a claim we have not
            // heard of yet, say): decide on what the API says, not on the cache.
            views.retain(|v| v.uid != confirmed.uid);
            views.push(confirmed);
            plan = decide(&view, &views, now);
        }
        if plan.grant.is_some() && current.fencing_token == 0 {
            // The first grant of this lease object: continue above the last token issued
            // under its name before it was (re-)created. Read from the API, not a cache.
            view.high_water_mark = high_water::read(ctx, ns, name).await?;
            plan = decide(&view, &views, now);
        }
        let refs: Vec<&FencedLeaseClaim> = claims.iter().map(|c| c.as_ref()).collect();
        let desired = status::lease_status(
            &current,
            &plan,
            &refs,
            lease.metadata.generation,
            Timestamp::now(),
        );
        if current == desired {
            return Ok(Some((current, lease, plan)));
        }
        let mut update = lease.clone();
        update.status = Some(desired);
        update.metadata.managed_fields = None;
        let written = timed(
            "write lease status",
            ctx.api_timeout,
            api.replace_status(name, &PostParams::default(), &update),
        )
        .await;
        match written {
            Ok(written) => return Ok(Some((current, written, plan))),
            Err(e) if e.is_conflict() => {
                ctx.metrics.conflicts.inc();
                info!(lease = %name, namespace = %ns, "lease changed since it was read; deciding again");
                match timed("read lease", ctx.api_timeout, api.get_opt(name)).await? {
                    Some(fresh) => lease = fresh,
                    None => return Ok(None),
                }
            }
            Err(e) => return Err(e),
        }
    }
    Err(Error::Contended(format!("{ns}/{name}")))
}

fn claim_view(
    ctx: &Context,
    claim: &FencedLeaseClaim,
    pod: PodPresence,
    now: Instant,
    duration: Duration,
) -> ClaimView {
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    ClaimView {
        name: claim.name_any(),
        heartbeat_deadline: ctx.heartbeats.last_change(&uid, now) + duration,
        uid,
        created: claim
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(0, |t| t.0.as_second()),
        deleting: claim.metadata.deletion_timestamp.is_some(),
        pod,
        phase: claim.status.as_ref().and_then(|s| s.phase),
    }
}

/// A hold ends because its claim or pod is gone only when the API says so. When the cache
/// alone says so (it has not heard of the claim or its pod yet), this returns the holder as
/// the API has it, to decide again on.
async fn confirm_holder(
    ctx: &Context,
    ns: &str,
    current: &FencedLeaseStatus,
    plan: &Plan,
    now: Instant,
    duration: Duration,
) -> Result<Option<ClaimView>> {
    let (Some(ended), Some(holder)) = (&plan.ended, &current.holder) else {
        return Ok(None);
    };
    if !matches!(ended.reason, EndReason::Released | EndReason::PodDeleted) {
        return Ok(None);
    }
    let api: Api<FencedLeaseClaim> = Api::namespaced(ctx.client.clone(), ns);
    let Some(claim) = timed(
        "read holder claim",
        ctx.api_timeout,
        api.get_opt(&holder.claim),
    )
    .await?
    else {
        return Ok(None); // really gone
    };
    if claim.metadata.uid.as_deref() != Some(holder.claim_uid.as_str()) {
        return Ok(None); // a new claim of the same name: the holder's is gone
    }
    let pod = pods::confirmed_presence(ctx, &claim).await?;
    Ok(Some(claim_view(ctx, &claim, pod, now, duration)))
}

async fn report_transitions(
    ctx: &Context,
    lease: &FencedLease,
    before: &FencedLeaseStatus,
    plan: &Plan,
    ns: &str,
    name: &str,
) {
    let reference = lease.object_ref(&());
    let status = lease.status.clone().unwrap_or_default();
    if let (Some(ended), Some(holder)) = (&plan.ended, &before.holder) {
        let who = format!("{} (claim {})", holder.identity, holder.claim);
        let token = before.fencing_token;
        let (reason, transition, note) = match ended.reason {
            EndReason::Expired => (
                "Expired",
                Transition::Expired,
                format!(
                    "{who} expired with token {token}: no heartbeat for {}s",
                    lease.spec.lease_duration_seconds
                ),
            ),
            EndReason::Released => (
                "Released",
                Transition::Released,
                format!("{who} released token {token}"),
            ),
            EndReason::PodDeleted => (
                "Revoked",
                Transition::Revoked,
                format!("{who} lost token {token}: its pod was deleted"),
            ),
            EndReason::LeaseDeleted => (
                "Revoked",
                Transition::Revoked,
                format!("{who} lost token {token}: the lease is being deleted"),
            ),
        };
        info!(lease = %name, namespace = %ns, claim = %holder.claim, token, reason, "holder ended");
        ctx.metrics.transition(ns, name, transition);
        let related = claim_reference(ns, &holder.claim, &holder.claim_uid);
        ctx.event_about(
            &reference,
            Some(related),
            EventType::Normal,
            reason,
            "Hand-over",
            note,
        )
        .await;
    }
    if let Some(grant) = &plan.grant {
        let identity = status
            .holder
            .as_ref()
            .map(|h| h.identity.clone())
            .unwrap_or_default();
        info!(lease = %name, namespace = %ns, claim = %grant.claim, token = grant.token, holder = %identity, "granted");
        ctx.metrics.transition(ns, name, Transition::Granted);
        let note = format!(
            "granted token {} to {identity} (claim {})",
            grant.token, grant.claim
        );
        let related = claim_reference(ns, &grant.claim, &grant.uid);
        ctx.event_about(
            &reference,
            Some(related),
            EventType::Normal,
            "Granted",
            "Grant",
            note,
        )
        .await;
    }
    if plan.tokens_exhausted {
        let note = "no fencing token is left to issue: the token space is exhausted".to_string();
        ctx.event(
            &reference,
            EventType::Warning,
            "TokensExhausted",
            "Grant",
            note,
        )
        .await;
    }
}

/// Brings every claim of the lease in line with the lease status: first those that lose or
/// wait, then the holder, so no moment shows two claims `Granted`.
async fn repair_claims(
    ctx: &Context,
    status: &FencedLeaseStatus,
    plan: &Plan,
    ns: &str,
    name: &str,
) -> Result<()> {
    let api: Api<FencedLeaseClaim> = Api::namespaced(ctx.client.clone(), ns);
    let now = Timestamp::now();
    let mut writes: Vec<(Arc<FencedLeaseClaim>, crate::api::FencedLeaseClaimStatus)> =
        claims_of(ctx, ns, name)
            .into_iter()
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .filter_map(|c| {
                let presence = pods::presence(&c, &ctx.pods);
                let desired = status::claim_status(&c, name, status, plan, presence, now);
                (c.status.as_ref() != Some(&desired)).then_some((c, desired))
            })
            .collect();
    writes.sort_by_key(|(_, s)| s.phase == Some(ClaimPhase::Granted));
    for (claim, desired) in writes {
        let claim_name = claim.name_any();
        let became = desired.phase;
        let was = claim.status.as_ref().and_then(|s| s.phase);
        let pod_missing_now = desired
            .conditions
            .iter()
            .any(|c| c.type_ == "PodFound" && c.status == "False")
            && !claim
                .status
                .iter()
                .flat_map(|s| &s.conditions)
                .any(|c| c.type_ == "PodFound" && c.status == "False");
        let patch = json!({
            "apiVersion": "fencing.dev/v1alpha1",
            "kind": "FencedLeaseClaim",
            "status": desired,
        });
        let params = PatchParams::apply(MANAGER).force();
        match timed(
            "write claim status",
            ctx.api_timeout,
            api.patch_status(&claim_name, &params, &Patch::Apply(&patch)),
        )
        .await
        {
            Ok(_) => {}
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e),
        }
        if was != became && became == Some(ClaimPhase::Granted) {
            let token = desired.fencing_token.unwrap_or_default();
            ctx.event(
                &claim.object_ref(&()),
                EventType::Normal,
                "Granted",
                "Grant",
                format!("holds lease {name} with token {token}"),
            )
            .await;
        } else if was != became && matches!(became, Some(ClaimPhase::Expired | ClaimPhase::Revoked))
        {
            let reason = if became == Some(ClaimPhase::Expired) {
                "Expired"
            } else {
                "Revoked"
            };
            ctx.event(
                &claim.object_ref(&()),
                EventType::Warning,
                reason,
                "Hand-over",
                desired.message.clone().unwrap_or_default(),
            )
            .await;
        }
        if pod_missing_now {
            let pod = claim.spec.pod_name.clone().unwrap_or_default();
            ctx.event(&claim.object_ref(&()), EventType::Warning, "PodNotFound", "Grant", format!("pod {pod} does not exist in namespace {ns}; the claim cannot hold lease {name} until it does")).await;
        }
    }
    Ok(())
}
