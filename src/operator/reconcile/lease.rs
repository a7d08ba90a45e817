//! The FencedLease reconciler: gather the lease, its claims and their pods from the caches,
//! [`decide`], confirm and make final any expiry on a fresh read ([`expire`]), write the
//! lease status (the linearization point: one write carrying the resourceVersion it was
//! decided on), then repair claim statuses and pod annotations from it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::{info, warn};

use super::backoff::retry_delay;
use super::cached::CachedClaim;
use super::context::{Context, claim_reference};
use super::decide::{ClaimView, EndReason, LeaseView, Plan, PodPresence, decide};
use super::error::{Error, Result, timed};
use super::expire::{Confirmed, Fresh, confirm_and_expire};
use super::metrics::Transition;
use super::{high_water, pods, status};
use crate::api::{ClaimPhase, FencedLease, FencedLeaseClaim, FencedLeaseStatus};

/// Field manager of the operator's claim status writes.
pub const MANAGER: &str = "fenced-lease-operator";
/// Rounds of decide-and-write before giving up this reconcile (each after a 409 re-read or
/// an expiry confirmation).
const MAX_ROUNDS: usize = 8;
/// Look again this soon at a lease whose cached copy lags the operator's own write.
const STALE_RETRY: Duration = Duration::from_secs(2);

pub async fn reconcile(lease: Arc<FencedLease>, ctx: Arc<Context>) -> Result<Action> {
    if !ctx.is_synced() {
        return Ok(Action::requeue(Duration::from_millis(200)));
    }
    let started = Instant::now();
    let result = reconcile_lease(lease.clone(), &ctx).await;
    ctx.metrics
        .reconcile_duration
        .observe(started.elapsed().as_secs_f64());
    if result.is_ok() {
        ctx.failures.succeeded(&failure_key(&lease));
    }
    ctx.swept.finished(&super::context::lease_key(&lease));
    result
}

fn failure_key(lease: &FencedLease) -> String {
    format!(
        "{}/{}",
        lease.namespace().unwrap_or_default(),
        lease.name_any()
    )
}

/// Failed reconciles are retried with exponential backoff; the error is counted, logged,
/// and reported by a Warning Event when its cause is new, and again at the 2nd, 4th, 8th...
/// failure in a row (an Event series whose count shows it goes on), never once per retry.
pub fn error_policy(lease: Arc<FencedLease>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.error(error.metric_label());
    let (attempt, new_cause) = ctx
        .failures
        .failed(&failure_key(&lease), error.event_reason());
    if error.is_conflict() {
        // Someone else moved first; deciding again on fresh state is routine.
        tracing::debug!(lease = %lease.name_any(), namespace = ?lease.namespace(), error = %error, "reconcile conflicted");
    } else {
        warn!(lease = %lease.name_any(), namespace = ?lease.namespace(), error = %error, attempt, "reconcile failed");
        if new_cause || attempt.is_power_of_two() {
            let reference = lease.object_ref(&());
            let note = format!("{error}");
            ctx.event(
                &reference,
                EventType::Warning,
                error.event_reason(),
                "Reconcile",
                note,
            );
        }
    }
    Action::requeue(retry_delay(attempt, rand::random::<f64>()))
}

async fn reconcile_lease(lease: Arc<FencedLease>, ctx: &Context) -> Result<Action> {
    let ns = lease
        .namespace()
        .ok_or_else(|| Error::Unexpected("FencedLease without a namespace".into()))?;
    let name = lease.name_any();
    let api: Api<FencedLease> = Api::namespaced(ctx.client.clone(), &ns);

    if lease.metadata.deletion_timestamp.is_some() {
        return finalize(ctx, &api, &lease, &ns, &name).await;
    }
    if ctx.written.is_superseded(
        lease.metadata.uid.as_deref(),
        lease.metadata.resource_version.as_deref(),
    ) {
        // The cache has not shown this operator's own last write of the lease yet: deciding
        // on this copy would repeat it (a 409 and a read). Its watch event brings the next
        // reconcile; the requeue is only a safety net.
        return Ok(Action::requeue(STALE_RETRY));
    }
    let lease = if high_water::has_finalizer(&lease) {
        lease
    } else {
        // No token is issued before the finalizer that will record it is in place; the
        // lease as written carries it, so the grant goes on in this same reconcile.
        match high_water::add_finalizer(ctx, &api, &lease).await {
            // Our cached copy is older than the lease: its update event is on its way.
            Err(e) if e.is_conflict() => return Ok(Action::requeue(Duration::from_millis(100))),
            Ok(Some(mut written)) if high_water::has_finalizer(&written) => {
                written.metadata.managed_fields = None;
                Arc::new(written)
            }
            result => {
                result?;
                return Ok(Action::await_change());
            }
        }
    };

    // The bindings that fence the lease's objects come before any grant: a binding reaches
    // admission through the apiserver's informers, so after creating or restoring one the
    // lease is decided again only once it is in force. A failure to write one holds up no
    // grant or expiry; it is returned once they are done.
    let fenced = super::fence_binding::sync(ctx, &lease).await;
    if let Ok(Some(in_force)) = fenced {
        return Ok(Action::requeue(
            in_force.saturating_duration_since(Instant::now()),
        ));
    }

    let written = match write_lease_status(ctx, &api, (*lease).clone(), &ns, &name).await {
        Err(error @ Error::TokenRecord { .. }) => {
            degrade(ctx, &api, &lease, &error).await;
            return Err(error);
        }
        written => written?,
    };
    let (before, lease, plan, fresh) = match written {
        Outcome::Written(outcome) => *outcome,
        Outcome::Gone => return Ok(Action::await_change()),
        Outcome::Requeue => return Ok(Action::requeue(Duration::from_millis(100))),
    };
    report_transitions(ctx, &lease, &before, &plan, &ns, &name);

    let status = lease.status.clone().unwrap_or_default();
    repair_claims(ctx, &status, &plan, &fresh, &ns, &name).await?;
    pods::repair_annotations(ctx, &lease, &ns, &name).await?;
    fenced?;

    let idle = Instant::now() + ctx.resync_after();
    ctx.wakeups
        .set(&ns, &name, plan.wake_at.map_or(idle, |at| at.min(idle)));
    Ok(Action::await_change())
}

/// The deletion path. The last token is recorded first: that alone must succeed before the
/// lease may go. Revoking its holder, the claims' statuses and the pod annotations are best
/// effort, so a refused pod patch (say) cannot wedge the deletion of a namespace; claims and
/// pods of a lease that is gone are repaired by the claim reconciler anyway.
async fn finalize(
    ctx: &Context,
    api: &Api<FencedLease>,
    lease: &FencedLease,
    ns: &str,
    name: &str,
) -> Result<Action> {
    if !high_water::has_finalizer(lease) {
        return Ok(Action::await_change());
    }
    let status = lease.status.clone().unwrap_or_default();
    let last = status.fencing_token.max(lease.spec.min_token);
    high_water::record(ctx, ns, name, last).await?;

    // The finalizer is removed with the resourceVersion of the last write (the revoking status
    // write, if any): the one read would always meet a 409, and a retry after backoff.
    let mut latest: Option<FencedLease> = None;
    let revoked = async {
        if let Outcome::Written(outcome) =
            write_lease_status(ctx, api, lease.clone(), ns, name).await?
        {
            let (before, written, plan, fresh) = *outcome;
            report_transitions(ctx, &written, &before, &plan, ns, name);
            let status = written.status.clone().unwrap_or_default();
            latest = Some(written);
            repair_claims(ctx, &status, &plan, &fresh, ns, name).await?;
        }
        pods::repair_annotations(ctx, lease, ns, name).await?;
        // The bindings that fence its objects go with the lease (an orphan is also swept).
        super::fence_binding::sync(ctx, lease).await.map(drop)
    };
    if let Err(error) = revoked.await {
        warn!(lease = %name, namespace = %ns, %error, "could not revoke every claim and pod annotation of a deleted lease; the claim reconciler finishes it");
    }
    if let Some(left) = holders_may_believe(ctx, lease, &status, ns, name).await? {
        info!(lease = %name, namespace = %ns, wait_ms = left.as_millis() as u64, "lease deleted; its name is kept until its last holder's term has run out");
        return Ok(Action::requeue(left));
    }
    high_water::remove_finalizer(ctx, api, latest.as_ref().unwrap_or(lease)).await?;
    ctx.metrics.forget_lease(ns, name);
    info!(lease = %name, namespace = %ns, token = last, "lease deleted; last token recorded");
    Ok(Action::await_change())
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
    let lease_term = seconds(lease.spec.lease_duration_seconds).max(
        status
            .lease_duration_seconds
            .map_or(Duration::ZERO, seconds),
    );
    let mut claims = claims_of(ctx, ns, name);
    if let Some(holder) = &status.holder
        && !claims
            .iter()
            .any(|c| c.metadata.uid.as_deref() == Some(holder.claim_uid.as_str()))
    {
        let api: Api<FencedLeaseClaim> = Api::namespaced(ctx.client.clone(), ns);
        let read = match timed(
            "read holder claim of a deleted lease",
            ctx.api_timeout,
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
            .map_or(lease_term, |d| seconds(d).max(lease_term));
        let end = ctx.heartbeats.last_change(uid, now) + term;
        until = until.max(Some(end));
    }
    Ok(until
        .filter(|t| *t > now)
        .map(|t| t.saturating_duration_since(now)))
}

/// Says on the lease, with condition `Degraded`, why no token can be issued (best effort: the
/// error is also logged and reported as an Event by the error policy).
async fn degrade(ctx: &Context, api: &Api<FencedLease>, lease: &FencedLease, error: &Error) {
    let mut update = lease.clone();
    update.metadata.managed_fields = None;
    let status = update.status.get_or_insert_with(Default::default);
    let message = error.to_string();
    status::set_condition(
        &mut status.conditions,
        "Degraded",
        "True",
        error.event_reason(),
        crate::operator::error::truncate(&message, 1024),
        lease.metadata.generation,
        Timestamp::now(),
    );
    if update.status == lease.status {
        return;
    }
    let name = lease.name_any();
    if let Err(e) = timed(
        "write lease condition",
        ctx.api_timeout,
        api.replace_status(&name, &PostParams::default(), &update),
    )
    .await
    {
        tracing::debug!(lease = %name, error = %e, "could not set the Degraded condition");
    }
}

fn seconds(s: i32) -> Duration {
    Duration::from_secs(u64::try_from(s).unwrap_or(1).max(1))
}

/// The claims of lease `ns/lease` in the cache, found by index.
fn claims_of(ctx: &Context, ns: &str, lease: &str) -> Vec<Arc<CachedClaim>> {
    ctx.claims_by_lease
        .get(ns, lease)
        .into_iter()
        .filter_map(|name| ctx.claims.get(ns, &name))
        .filter(|c| c.spec.lease_name == lease)
        .collect()
}

/// The lease's claims: the cache, overlaid with what this reconcile read from the API.
fn current_claims(ctx: &Context, ns: &str, lease: &str, fresh: &Fresh) -> Vec<Arc<CachedClaim>> {
    let mut claims: Vec<Arc<CachedClaim>> = claims_of(ctx, ns, lease)
        .into_iter()
        .filter(|c| {
            !c.metadata
                .uid
                .as_ref()
                .is_some_and(|uid| fresh.contains_key(uid))
        })
        .collect();
    claims.extend(fresh.values().flatten().cloned().map(Arc::new));
    claims
}

type Written = (FencedLeaseStatus, FencedLease, Plan, Fresh);

/// How [`write_lease_status`] ended.
enum Outcome {
    /// The status the decision started from, the lease as written (or as read, when nothing
    /// changed), the plan it carries, and the claims read fresh on the way.
    Written(Box<Written>),
    /// The lease is gone.
    Gone,
    /// The lease was replaced, is being deleted, or lost its finalizer since the reconcile
    /// started: decide again from the start.
    Requeue,
}

/// Decides and writes the lease status. Expiries the decision asks for are confirmed and made
/// final first (then it decides again); on 409 it re-reads the lease and decides again.
async fn write_lease_status(
    ctx: &Context,
    api: &Api<FencedLease>,
    mut lease: FencedLease,
    ns: &str,
    name: &str,
) -> Result<Outcome> {
    let mut fresh = Fresh::new();
    // Pod presence the API confirmed for a claim (by UID), over the cache's.
    let mut confirmed_pods: HashMap<String, PodPresence> = HashMap::new();
    let mut lease_read = false;
    for _ in 0..MAX_ROUNDS {
        let claims = current_claims(ctx, ns, name, &fresh);
        let current = lease.status.clone().unwrap_or_default();
        if !lease_read && newest_grant(&claims) > current.fencing_token {
            // A claim shows a grant this copy of the lease does not: the lease cache lags
            // the claim cache (its watch is reconnecting, say). Deciding on it would revoke
            // the holder the lease really has; read the lease instead.
            lease_read = true;
            match timed("read lease", ctx.api_timeout, api.get_opt(name)).await? {
                Some(read) if read.metadata.uid == lease.metadata.uid => lease = read,
                Some(_) => return Ok(Outcome::Requeue),
                None => return Ok(Outcome::Gone),
            }
            continue;
        }
        let holder_pod_uid = current.holder.as_ref().and_then(|h| h.pod_uid.clone());
        let holder_uid = current.holder.as_ref().map(|h| h.claim_uid.clone());
        let now = Instant::now();
        let views: Vec<ClaimView> = claims
            .iter()
            .map(|c| {
                let granted_to = (c.metadata.uid == holder_uid)
                    .then_some(holder_pod_uid.as_deref())
                    .flatten();
                let confirmed = c.metadata.uid.as_ref().and_then(|u| confirmed_pods.get(u));
                let pod = confirmed
                    .copied()
                    .unwrap_or_else(|| pods::presence(c, &ctx.pods, granted_to));
                claim_view(ctx, c, pod, now)
            })
            .collect();
        let duration = seconds(lease.spec.lease_duration_seconds);
        let mut view = LeaseView {
            holder_uid,
            last_token: current.fencing_token,
            high_water_mark: 0,
            min_token: lease.spec.min_token,
            deleting: lease.metadata.deletion_timestamp.is_some(),
            term: current.lease_duration_seconds.map_or(duration, seconds),
            duration,
        };
        let mut plan = decide(&view, &views, now, Timestamp::now().as_millisecond());
        if let Some((claim, pod)) = confirm_holder(ctx, ns, &current, &plan).await? {
            // The cache was behind the API (another replica granted a claim we have not
            // heard of yet, say): decide on what the API says, not on the cache.
            if let Some(uid) = claim.metadata.uid.clone() {
                confirmed_pods.insert(uid.clone(), pod);
                fresh.insert(uid, Some(claim));
            }
            continue;
        }
        if !plan.expire.is_empty() {
            for uid in &plan.expire {
                let Some(claim) = views.iter().find(|v| &v.uid == uid) else {
                    continue;
                };
                let holder = view.holder_uid.as_ref() == Some(uid);
                let confirmed = confirm_and_expire(
                    ctx,
                    ns,
                    name,
                    &claim.name,
                    uid,
                    claim.last_beat,
                    holder,
                    &mut fresh,
                )
                .await?;
                if confirmed == Confirmed::Changed {
                    break;
                }
            }
            continue; // decide again on what the API said
        }
        if plan.grant.is_some() && current.fencing_token == 0 {
            // The first grant of this lease object: continue above the last token recorded
            // under its name before it was (re-)created. Read from the API, not a cache; a
            // damaged record stops the grant.
            view.high_water_mark = high_water::read(ctx, ns, name).await?;
            plan = decide(&view, &views, now, Timestamp::now().as_millisecond());
        }
        let refs: Vec<&CachedClaim> = claims.iter().map(|c| c.as_ref()).collect();
        let granted = plan.grant.as_ref().and_then(|g| {
            claims
                .iter()
                .find(|c| c.metadata.uid.as_deref() == Some(&g.uid))
        });
        let term = status::Term {
            duration_seconds: lease.spec.lease_duration_seconds,
            pod_uid: granted.and_then(|c| pods::pod_uid(c, &ctx.pods)),
        };
        let desired = status::lease_status(
            &current,
            &plan,
            &refs,
            &term,
            lease.metadata.generation,
            Timestamp::now(),
        );
        if current == desired {
            return Ok(Outcome::Written(Box::new((current, lease, plan, fresh))));
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
            Ok(written) => {
                ctx.written.wrote(
                    written.metadata.uid.as_deref().unwrap_or_default(),
                    update.metadata.resource_version.as_deref(),
                    written.metadata.resource_version.as_deref(),
                );
                return Ok(Outcome::Written(Box::new((current, written, plan, fresh))));
            }
            Err(e) if e.is_conflict() => {
                ctx.metrics.conflicts.inc();
                info!(lease = %name, namespace = %ns, "lease changed since it was read; deciding again");
                let Some(read) = timed("read lease", ctx.api_timeout, api.get_opt(name)).await?
                else {
                    return Ok(Outcome::Gone);
                };
                let replaced = read.metadata.uid != lease.metadata.uid;
                let newly_deleting = read.metadata.deletion_timestamp.is_some()
                    && lease.metadata.deletion_timestamp.is_none();
                if replaced || newly_deleting || !high_water::has_finalizer(&read) {
                    return Ok(Outcome::Requeue);
                }
                lease = read;
            }
            Err(e) => return Err(e),
        }
    }
    Err(Error::Contended(format!("{ns}/{name}")))
}

/// The highest token any `Granted` claim shows.
fn newest_grant(claims: &[Arc<CachedClaim>]) -> i64 {
    claims
        .iter()
        .filter_map(|c| c.status.as_ref())
        .filter(|s| s.phase == Some(ClaimPhase::Granted))
        .filter_map(|s| s.fencing_token)
        .max()
        .unwrap_or(0)
}

fn claim_view(ctx: &Context, claim: &CachedClaim, pod: PodPresence, now: Instant) -> ClaimView {
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    ClaimView {
        name: claim.name_any(),
        last_beat: ctx.heartbeats.last_change(&uid, now),
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
/// alone says so (it has not heard of the claim or its pod yet), this returns the holder's
/// claim and pod presence as the API has them, to decide again on.
async fn confirm_holder(
    ctx: &Context,
    ns: &str,
    current: &FencedLeaseStatus,
    plan: &Plan,
) -> Result<Option<(CachedClaim, PodPresence)>> {
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
    let claim = CachedClaim::from(claim);
    if claim.metadata.uid.as_deref() != Some(holder.claim_uid.as_str())
        || claim.metadata.deletion_timestamp.is_some()
    {
        return Ok(None); // a new claim of the same name, or being released
    }
    let pod = pods::confirmed_presence(ctx, &claim, holder.pod_uid.as_deref()).await?;
    if pod == PodPresence::Missing && ended.reason == EndReason::PodDeleted {
        return Ok(None); // really gone
    }
    Ok(Some((claim, pod)))
}

fn report_transitions(
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
                    before
                        .lease_duration_seconds
                        .unwrap_or(lease.spec.lease_duration_seconds)
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
            EndReason::Revoked => (
                "Revoked",
                Transition::Revoked,
                format!("{who} lost token {token}: its claim was revoked"),
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
        );
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
        );
    }
    if plan.tokens_exhausted {
        let note = "no fencing token is left to issue: the token space is exhausted".to_string();
        ctx.event(
            &reference,
            EventType::Warning,
            "TokensExhausted",
            "Grant",
            note,
        );
    }
}

/// Brings every claim of the lease in line with the lease status: first those that lose or
/// wait, then the holder, so no moment shows two claims `Granted`.
async fn repair_claims(
    ctx: &Context,
    status: &FencedLeaseStatus,
    plan: &Plan,
    fresh: &Fresh,
    ns: &str,
    name: &str,
) -> Result<()> {
    let api: Api<FencedLeaseClaim> = Api::namespaced(ctx.client.clone(), ns);
    let now = Timestamp::now();
    let holder = status.holder.as_ref();
    let mut writes: Vec<(Arc<CachedClaim>, crate::api::FencedLeaseClaimStatus)> =
        current_claims(ctx, ns, name, fresh)
            .into_iter()
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            // A claim whose cached copy this operator has already written over: its watch
            // event is on its way and reconciles the lease again; writing now would repeat.
            .filter(|c| {
                !ctx.written.is_superseded(
                    c.metadata.uid.as_deref(),
                    c.metadata.resource_version.as_deref(),
                )
            })
            // A claim granted a token above this status's was granted after it was written
            // (by another replica, between our write and this repair): this status is stale
            // for it, and must not revoke it.
            .filter(|c| newest_grant(std::slice::from_ref(c)) <= status.fencing_token)
            .filter_map(|c| {
                let granted_to = holder
                    .filter(|h| c.metadata.uid.as_deref() == Some(h.claim_uid.as_str()))
                    .and_then(|h| h.pod_uid.as_deref());
                let presence = pods::presence(&c, &ctx.pods, granted_to);
                let desired = status::claim_status(&c, name, status, plan, presence, now);
                let same = c.status.as_ref().is_some_and(|s| *s == desired);
                (!same).then_some((c, desired))
            })
            .collect();
    // Those that lose the lease first, so no moment shows two claims Granted; then the new
    // holder, so a hand-over does not wait for the queue's position updates; then the queue.
    writes.sort_by_key(|(_, s)| match s.phase {
        Some(ClaimPhase::Expired | ClaimPhase::Revoked) => 0,
        Some(ClaimPhase::Granted) => 1,
        _ => 2,
    });
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
                .as_ref()
                .is_some_and(|s| s.has_condition("PodFound", "False"));
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
            Ok(written) => ctx.written.wrote(
                claim.metadata.uid.as_deref().unwrap_or_default(),
                claim.metadata.resource_version.as_deref(),
                written.metadata.resource_version.as_deref(),
            ),
            Err(e) if e.is_not_found() => continue,
            // The claim reached a final phase the cache has not shown us yet (Expired and
            // Revoked are final; the CRD refuses to leave them): nothing to repair.
            Err(e) if e.is_invalid() => {
                tracing::debug!(claim = %claim_name, error = %e, "claim status not repaired");
                continue;
            }
            Err(e) => return Err(e),
        }
        if was != became && became == Some(ClaimPhase::Granted) {
            let token = desired.fencing_token.unwrap_or_default();
            ctx.event(
                &claim.reference(),
                EventType::Normal,
                "Granted",
                "Grant",
                format!("holds lease {name} with token {token}"),
            );
        } else if was != became && matches!(became, Some(ClaimPhase::Expired | ClaimPhase::Revoked))
        {
            let reason = if became == Some(ClaimPhase::Expired) {
                "Expired"
            } else {
                "Revoked"
            };
            ctx.event(
                &claim.reference(),
                EventType::Warning,
                reason,
                "Hand-over",
                desired.message.clone().unwrap_or_default(),
            );
        }
        if pod_missing_now {
            let pod = claim.spec.pod_name.clone().unwrap_or_default();
            ctx.event(&claim.reference(), EventType::Warning, "PodNotFound", "Grant", format!("pod {pod} does not exist in namespace {ns}; the claim cannot hold lease {name} until it does"));
        }
    }
    Ok(())
}
