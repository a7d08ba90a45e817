//! Expiry made safe (I9): a claim whose heartbeat the operator has not seen change is expired
//! only by a status write preconditioned on the resourceVersion of a copy that shows the same
//! heartbeat the operator last saw change. A renew that lands in between makes the write fail
//! with 409; after the write, the CRD refuses any change of the claim's `spec.renewTime`
//! (CEL), so no renew can succeed once the claim is `Expired`. Only then may the lease go to
//! someone else.
//!
//! The copy is first the one the operator already has (the cache's, or this reconcile's
//! read): the write succeeds only if the API still stores exactly that version, so a read
//! before it would show nothing more, and an expiry at its deadline costs one round trip, not
//! two. When that write conflicts (the cache lags, or the claim changed), a fresh read
//! decides: the heartbeat it shows is compared with the last one seen, and the write goes on
//! that read's version. So the cache never decides an expiry on its own: not after a
//! partition of the operator alone, nor after a pause, nor when a watch lags. Whatever the
//! cache missed, the precondition refuses and the fresh read sees.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use tracing::info;

use super::write_watched;
use crate::context::Context;
use crate::core::claim_status;
use crate::error::{Result, timed};
use crate::state::Memory;
use crate::state::claim::CachedClaim;
use crate::state::heartbeat::beat_of;
use fenced_lease_api::{ClaimPhase, FencedLeaseClaim};

/// Claims read from the API during one reconcile, by UID: fresher than the cache. `None`
/// marks a claim the API no longer has.
pub type Fresh = HashMap<String, Option<CachedClaim>>;

/// How a confirmation ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Confirmed {
    /// The claim is `Expired` now (written here, or already).
    Expired,
    /// Its heartbeat moved since the operator last saw it: it lives on, with a fresh clock.
    Alive,
    /// The claim is gone (or replaced by another of the same name).
    Gone,
    /// It changed between our read and our write: decide again.
    Changed,
}

/// A claim the decision found silent: its name and UID, when the decision last saw its
/// heartbeat change, whether it held the lease (for the message and Event), and, for the
/// holder, the deadline its term ran out at (for `fenced_lease_expiry_delay_seconds`).
pub struct Silent<'a> {
    pub name: &'a str,
    pub uid: &'a str,
    pub seen_at: Instant,
    pub holder: bool,
    pub deadline: Option<Instant>,
}

/// Confirms that claim `silent` of lease `ns/lease` has stayed silent since it was last seen
/// to beat, and makes its expiry final.
pub async fn confirm_and_expire(
    ctx: &Context,
    ns: &str,
    lease: &str,
    silent: &Silent<'_>,
    fresh: &mut Fresh,
) -> Result<Confirmed> {
    let (name, uid) = (silent.name, silent.uid);
    let api: Api<FencedLeaseClaim> = Api::namespaced(ctx.kube.client.clone(), ns);
    if let Some(known) = known_copy(&ctx.memory, ns, silent, fresh) {
        match expire(ctx, &api, known, lease, silent, fresh).await? {
            // Not the version stored any more: read it, and decide on what it shows.
            Confirmed::Changed => {}
            done => return Ok(done),
        }
    }
    let read = timed(
        "read claim before expiry",
        ctx.kube.timeout,
        api.get_opt(name),
    )
    .await?;
    let Some(claim) = read.filter(|c| c.metadata.uid.as_deref() == Some(uid)) else {
        fresh.insert(uid.to_string(), None);
        return Ok(Confirmed::Gone);
    };
    let now = Instant::now();
    let phase = claim.status.as_ref().and_then(|s| s.phase);
    if matches!(phase, Some(ClaimPhase::Expired | ClaimPhase::Revoked)) {
        fresh.insert(uid.to_string(), Some(claim.into()));
        return Ok(Confirmed::Expired);
    }
    let beat = beat_of(&claim.spec);
    if ctx.memory.heartbeats.moved_since(uid, beat, silent.seen_at) {
        // The cache missed a heartbeat (a partition, a pause, a lagging watch), or the watch
        // brought one after the decision: the claim renewed after the operator last looked.
        // It gets a full term from now.
        ctx.memory.heartbeats.observe(uid, beat, None, now);
        info!(
            lease,
            namespace = ns,
            claim = name,
            "heartbeat moved while the cache was behind; not expiring"
        );
        fresh.insert(uid.to_string(), Some(claim.into()));
        return Ok(Confirmed::Alive);
    }
    expire(ctx, &api, claim, lease, silent, fresh).await
}

/// The copy of claim `silent` this reconcile already has (its own read, else the cache's),
/// as the API type, when it may be written `Expired` as it is: it shows the heartbeat the
/// operator last saw change, no change was seen since the decision, and it is not final yet.
fn known_copy(
    memory: &Memory,
    ns: &str,
    silent: &Silent<'_>,
    fresh: &Fresh,
) -> Option<FencedLeaseClaim> {
    let known = match fresh.get(silent.uid) {
        Some(read) => Arc::new(read.clone()?),
        None => memory.claims.get(ns, silent.name)?,
    };
    let final_phase = known
        .status
        .as_ref()
        .is_some_and(|s| matches!(s.phase, Some(ClaimPhase::Expired | ClaimPhase::Revoked)));
    let beat = beat_of(&known.spec);
    if known.metadata.uid.as_deref() != Some(silent.uid)
        || known.metadata.resource_version.is_none()
        || final_phase
        || memory
            .heartbeats
            .moved_since(silent.uid, beat, silent.seen_at)
    {
        return None;
    }
    let meta = &known.metadata;
    Some(FencedLeaseClaim {
        metadata: ObjectMeta {
            name: meta.name.clone(),
            namespace: meta.namespace.clone(),
            uid: meta.uid.clone(),
            resource_version: meta.resource_version.clone(),
            ..Default::default()
        },
        spec: known.spec.clone(),
        status: Some(known.full_status()),
    })
}

/// Writes claim `claim` (a copy showing the heartbeat last seen) `Expired`, on the
/// resourceVersion of that copy.
async fn expire(
    ctx: &Context,
    api: &Api<FencedLeaseClaim>,
    claim: FencedLeaseClaim,
    lease: &str,
    silent: &Silent<'_>,
    fresh: &mut Fresh,
) -> Result<Confirmed> {
    let holder = silent.holder;
    let (name, ns) = (claim.name_any(), claim.namespace().unwrap_or_default());
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    let mut update = claim.clone();
    update.metadata.managed_fields = None;
    let current = claim.status.clone().unwrap_or_default();
    update.status = Some(claim_status::expired_status(current, lease, holder));
    // Until the watch shows it, the cached copy (still live) must not be repaired over this
    // final status: the CRD would refuse it, one wasted write each time.
    let before = claim.metadata.resource_version.as_deref();
    let params = PostParams::default();
    let write = api.replace_status(&name, &params, &update);
    match write_watched(
        &ctx.kube,
        &ctx.memory,
        "expire claim",
        Some(&uid),
        before,
        write,
    )
    .await
    {
        Ok(written) => {
            if let Some(deadline) = silent.deadline {
                let delay = Instant::now().saturating_duration_since(deadline);
                ctx.metrics.expiry_delay.observe(delay.as_secs_f64());
            }
            info!(
                lease,
                namespace = %ns,
                claim = %name,
                holder,
                "claim expired: no heartbeat for the lease duration (the write was preconditioned on the version showing the last heartbeat seen)"
            );
            let note = written
                .status
                .as_ref()
                .and_then(|s| s.message.clone())
                .unwrap_or_default();
            let on = written.object_ref(&());
            ctx.events
                .event(&on, EventType::Warning, "Expired", "Hand-over", note);
            fresh.insert(uid, Some(written.into()));
            Ok(Confirmed::Expired)
        }
        Err(e) if e.is_conflict() => {
            tracing::debug!(lease, claim = %name, "claim changed before its expiry was written; deciding again");
            fresh.remove(&uid);
            Ok(Confirmed::Changed)
        }
        Err(e) if e.is_not_found() => {
            fresh.insert(uid, None);
            Ok(Confirmed::Gone)
        }
        Err(e) => Err(e),
    }
}
