//! A lease's status decided and written: each round decides ([`decide_round`]) on the caches
//! and what this reconcile has read from the API, and carries out the [`next_step`] it names.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use tracing::info;

use super::finalizer::{self, ahead, records};
use super::gather::{Gathered, Reads, holder_of, newest_grant};
use super::pods;
use super::{follow, write_watched};
use crate::context::{Context, Kube};
use crate::core::decide::{ClaimView, EndReason, Plan, PodPresence};
use crate::core::round::{Decision, RoundView, decide_round};
use crate::core::step::{Round, Step, next_step};
use crate::error::{Error, Result, timed};
use crate::reconcile::expire::{Confirmed, Fresh, Silent, confirm_and_expire};
use crate::state::CachedClaim;
use fenced_lease_api::{FencedLease, FencedLeaseClaim, FencedLeaseStatus};

/// Steps of one reconcile's status write before it gives up (each read, expiry or 409 is one).
const MAX_STEPS: usize = 16;

/// The status the decision started from, the lease as written (or as read, when nothing
/// changed), the plan it carries, and the claims it was decided on (the cache's, with those
/// read on the way in place of their cached copies).
pub type Written = (FencedLeaseStatus, FencedLease, Plan, Vec<Arc<CachedClaim>>);

/// How [`write_lease_status`] ended.
pub enum Outcome {
    Written(Box<Written>),
    /// The lease is gone.
    Gone,
    /// The lease was replaced, is being deleted, or lost its finalizer since the reconcile
    /// started: decide again from the start.
    Requeue,
}

/// Decides and writes the lease status, reading from the API first what the decision rests
/// on that the caches alone may not decide (see [`crate::core::step`]).
/// `unfenced`: why the lease's fence is not in force, if it is not (no one is granted then).
pub async fn write_lease_status(
    ctx: &Context,
    api: &Api<FencedLease>,
    mut lease: FencedLease,
    unfenced: Option<&str>,
) -> Result<Outcome> {
    let (ns, name) = (lease.namespace().unwrap_or_default(), lease.name_any());
    let mut reads = Reads::default();
    let mut gathered = Gathered::new(&ctx.memory, &lease);
    // The lease changed under this reconcile (another replica wrote it, say): what the caches
    // showed of its claims when it began may be older than that write, so they are gathered
    // again, as fresh as the caches are now.
    let mut lease_moved = false;
    for _ in 0..MAX_STEPS {
        if std::mem::take(&mut lease_moved) {
            gathered = Gathered::new(&ctx.memory, &lease);
            // Read again after this copy: a read older than it may be older than its holder.
            reads.known.followed_read = false;
            reads.followed = None;
        }
        let mut d = decide(ctx, &lease, &gathered, &reads, unfenced);
        let round = Round {
            current: &d.current,
            newest_grant: newest_grant(&d.claims),
            plan: &d.plan,
            unchanged: d.current == d.desired,
            now_ms: Timestamp::now().as_millisecond(),
        };
        match next_step(&reads.known, &round) {
            Step::ReadLease => {
                reads.known.lease_read = true;
                match reread(&ctx.kube, api, &lease).await? {
                    Reread::Lease(read) => {
                        lease_moved =
                            read.metadata.resource_version != lease.metadata.resource_version;
                        lease = *read;
                    }
                    Reread::Gone => return Ok(Outcome::Gone),
                    Reread::Replaced => return Ok(Outcome::Requeue),
                }
            }
            Step::ConfirmHolder => confirm_holder(ctx, &ns, &d, &mut reads).await?,
            Step::Expire => expire(ctx, &ns, &name, lease.term(), &d, &mut reads.fresh).await?,
            Step::ReadFollowed => read_followed(ctx, &lease, &mut reads).await?,
            Step::ReadRecord => {
                reads.known.record = Some(ahead::before_first_grant(ctx, &lease).await?);
            }
            Step::RecordAhead(token) => {
                records::record_ahead(ctx, &ns, &name, token).await?;
                reads.known.recorded_ahead = Some(token);
            }
            Step::Done => {
                let (current, plan, overlaid) = d.into_parts();
                let claims = overlaid.unwrap_or(gathered.claims);
                return Ok(Outcome::Written(Box::new((current, lease, plan, claims))));
            }
            Step::Write => match write(ctx, api, &lease, std::mem::take(&mut d.desired)).await? {
                Wrote::Lease(w) => {
                    if w.status.as_ref().is_some_and(|s| s.fencing_token > 0) {
                        ahead::forget(ctx, &w);
                    }
                    let (current, plan, overlaid) = d.into_parts();
                    let claims = overlaid.unwrap_or(gathered.claims);
                    return Ok(Outcome::Written(Box::new((current, *w, plan, claims))));
                }
                Wrote::Conflict(read) => {
                    lease = *read;
                    lease_moved = true;
                }
                Wrote::Gone => return Ok(Outcome::Gone),
                Wrote::Requeue => return Ok(Outcome::Requeue),
            },
        }
    }
    Err(Error::Contended(format!("{ns}/{name}")))
}

/// One round's decision, and the claims and views it rests on.
struct Decided<'g> {
    current: FencedLeaseStatus,
    claims: Cow<'g, [Arc<CachedClaim>]>,
    views: Cow<'g, [ClaimView]>,
    plan: Plan,
    /// The status the plan implies.
    desired: FencedLeaseStatus,
}

impl Decided<'_> {
    /// The status decided from and the plan, and the claims decided on when they are not the
    /// ones gathered (`None`: take those, without a copy).
    fn into_parts(self) -> (FencedLeaseStatus, Plan, Option<Vec<Arc<CachedClaim>>>) {
        let overlaid = match self.claims {
            Cow::Owned(claims) => Some(claims),
            Cow::Borrowed(_) => None,
        };
        (self.current, self.plan, overlaid)
    }
}

/// Decides ([`decide_round`]) on the lease as last read, its claims (as gathered, overlaid
/// with what was read) and their pods' presence, the Lease it follows (as read, else as
/// cached), above the token record when it has been read.
fn decide<'g>(
    ctx: &Context,
    lease: &FencedLease,
    gathered: &'g Gathered,
    reads: &Reads,
    unfenced: Option<&str>,
) -> Decided<'g> {
    let holder = holder_of(lease.status.as_ref());
    let (claims, views) = gathered.overlaid(&ctx.memory, reads, &holder);
    let cached;
    let followed = match (&lease.spec.follow, &reads.followed) {
        (None, _) => None,
        (Some(_), Some(read)) => Some(read),
        (Some(follow), None) => {
            let ns = lease.namespace().unwrap_or_default();
            cached = follow::cached(&ctx.memory, &ns, &follow.lease);
            Some(&cached)
        }
    };
    let view = RoundView {
        lease,
        claims: &claims,
        views: &views,
        followed,
        record: reads.known.record,
        unfenced,
    };
    let pod_uid = |c: &CachedClaim| pods::pod_uid(c, &ctx.memory.pods);
    let Decision {
        current,
        plan,
        desired,
    } = decide_round(&view, pod_uid, Instant::now(), Timestamp::now());
    Decided {
        current,
        claims,
        views,
        plan,
        desired,
    }
}

/// Reads the Lease `lease` follows from the API, into `reads`.
async fn read_followed(ctx: &Context, lease: &FencedLease, reads: &mut Reads) -> Result<()> {
    if let Some(follow) = &lease.spec.follow {
        let ns = lease.namespace().unwrap_or_default();
        reads.followed = Some(follow::read(&ctx.kube, &ctx.memory, &ns, &follow.lease).await?);
    }
    reads.known.followed_read = true;
    Ok(())
}

enum Reread {
    Lease(Box<FencedLease>),
    Gone,
    Replaced,
}

/// The lease as the API has it now.
async fn reread(kube: &Kube, api: &Api<FencedLease>, lease: &FencedLease) -> Result<Reread> {
    let name = lease.name_any();
    Ok(
        match timed("read lease", kube.timeout, api.get_opt(&name)).await? {
            Some(read) if read.metadata.uid == lease.metadata.uid => Reread::Lease(Box::new(read)),
            Some(_) => Reread::Replaced,
            None => Reread::Gone,
        },
    )
}

/// Expires the claims the plan names, each by a write preconditioned on a version showing the
/// heartbeat last seen ([`confirm_and_expire`]); stops at the first that changed meanwhile
/// (the next round decides again). `term` is the running term's duration: the holder's
/// deadline is that long after its last heartbeat seen.
async fn expire(
    ctx: &Context,
    ns: &str,
    name: &str,
    term: Duration,
    d: &Decided<'_>,
    fresh: &mut Fresh,
) -> Result<()> {
    let holder_uid = d.current.holder.as_ref().map(|h| h.claim_uid.as_str());
    for uid in &d.plan.expire {
        let Some(claim) = d.views.iter().find(|v| &v.uid == uid) else {
            continue;
        };
        let holder = holder_uid == Some(uid.as_str());
        let silent = Silent {
            name: &claim.name,
            uid,
            seen_at: claim.last_beat,
            holder,
            deadline: holder.then(|| claim.last_beat + term),
        };
        let confirmed = confirm_and_expire(ctx, ns, name, &silent, fresh).await?;
        if confirmed == Confirmed::Changed {
            break;
        }
    }
    Ok(())
}

enum Wrote {
    Lease(Box<FencedLease>),
    /// The lease changed since it was read: this is it now.
    Conflict(Box<FencedLease>),
    Gone,
    Requeue,
}

/// Writes `desired` as the status of `lease`, on the resourceVersion it was read at.
async fn write(
    ctx: &Context,
    api: &Api<FencedLease>,
    lease: &FencedLease,
    desired: FencedLeaseStatus,
) -> Result<Wrote> {
    let name = lease.name_any();
    let mut update = lease.clone();
    update.status = Some(desired);
    update.metadata.managed_fields = None;
    let params = PostParams::default();
    let write = api.replace_status(&name, &params, &update);
    let meta = &lease.metadata;
    let (uid, before) = (meta.uid.as_deref(), meta.resource_version.as_deref());
    match write_watched(
        &ctx.kube,
        &ctx.memory,
        "write lease status",
        uid,
        before,
        write,
    )
    .await
    {
        Ok(written) => Ok(Wrote::Lease(Box::new(written))),
        Err(e) if e.is_conflict() => {
            ctx.metrics.conflicts.inc();
            info!(lease = %name, namespace = ?lease.namespace(), "lease changed since it was read; deciding again");
            let Some(read) = timed("read lease", ctx.kube.timeout, api.get_opt(&name)).await?
            else {
                return Ok(Wrote::Gone);
            };
            let replaced = read.metadata.uid != lease.metadata.uid;
            let newly_deleting = read.metadata.deletion_timestamp.is_some()
                && lease.metadata.deletion_timestamp.is_none();
            if replaced || newly_deleting || !finalizer::has_finalizer(&read) {
                return Ok(Wrote::Requeue);
            }
            Ok(Wrote::Conflict(Box::new(read)))
        }
        Err(e) => Err(e),
    }
}

/// A hold ends because its claim or pod is gone only when the API says so. When the cache
/// alone says so (it has not heard of the claim or its pod yet), the holder's claim and pod
/// presence as the API has them are recorded in `reads`, to decide again on.
async fn confirm_holder(ctx: &Context, ns: &str, d: &Decided<'_>, reads: &mut Reads) -> Result<()> {
    let (Some(ended), Some(holder)) = (&d.plan.ended, &d.current.holder) else {
        return Ok(());
    };
    reads.known.holder_checked = Some(holder.claim_uid.clone());
    let api: Api<FencedLeaseClaim> = Api::namespaced(ctx.kube.client.clone(), ns);
    let read = timed(
        "read holder claim",
        ctx.kube.timeout,
        api.get_opt(&holder.claim),
    );
    let Some(claim) = read.await? else {
        return Ok(()); // really gone
    };
    let claim = CachedClaim::from(claim);
    if claim.metadata.uid.as_deref() != Some(holder.claim_uid.as_str())
        || claim.metadata.deletion_timestamp.is_some()
    {
        return Ok(()); // a new claim of the same name, or being released
    }
    let pod = pods::confirmed_presence(&ctx.kube, &claim, holder.pod_uid.as_deref()).await?;
    if pod == PodPresence::Missing && ended.reason == EndReason::PodDeleted {
        return Ok(()); // really gone
    }
    // The cache was behind the API (another replica granted a claim we have not heard of
    // yet, say): decide on what the API says, not on the cache.
    if let Some(uid) = claim.metadata.uid.clone() {
        reads.pods.insert(uid.clone(), pod);
        reads.fresh.insert(uid, Some(claim));
    }
    Ok(())
}
