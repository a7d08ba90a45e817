//! What a lease's reconcile decides on: its claims as the caches have them, each claim's view
//! (its pod's presence judged against the pod the holder was granted to), and what the
//! reconcile has read from the API in place of a cached copy.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use kube::ResourceExt;

use super::pods;
use crate::core::decide::{ClaimView, PodPresence};
use crate::core::follow::Followed;
use crate::core::step::Known;
use crate::reconcile::expire::Fresh;
use crate::state::CachedClaim;
use crate::state::Memory;
use fenced_lease_api::{ClaimPhase, FencedLease, FencedLeaseStatus};

/// What the reconcile has read from the API, over the caches.
#[derive(Default)]
pub(super) struct Reads {
    pub known: Known,
    pub fresh: Fresh,
    /// Pod presence the API confirmed for a claim (by UID), over the cache's.
    pub pods: HashMap<String, PodPresence>,
    /// The followed Lease as the API had it, over the cache's (`spec.follow`).
    pub followed: Option<Followed>,
}

/// A lease's claims as the caches have them when its reconcile begins, with what the decision
/// reads of each. Gathered once per reconcile, not once per round, unless the lease changed
/// under the reconcile: on a lease with a long queue, reading every claim from the caches is
/// most of a reconcile's work. What a round has read from the API takes the place of a
/// claim's cached copy (see [`Gathered::overlaid`]).
pub(super) struct Gathered {
    pub claims: Vec<Arc<CachedClaim>>,
    views: Vec<ClaimView>,
    /// The holder (claim UID, pod UID) the views' pod presence was judged for.
    holder: Holder,
}

/// A lease's holder as far as its pod goes: the claim UID and the pod UID it was granted to.
pub(super) type Holder = (Option<String>, Option<String>);

/// The holder a lease status names.
pub(super) fn holder_of(status: Option<&FencedLeaseStatus>) -> Holder {
    let holder = status.and_then(|s| s.holder.as_ref());
    (
        holder.map(|h| h.claim_uid.clone()),
        holder.and_then(|h| h.pod_uid.clone()),
    )
}

/// The claims' views, each pod's presence judged against the pod the holder was granted to.
fn views(
    memory: &Memory,
    claims: &[Arc<CachedClaim>],
    holder: &Holder,
    reads: &Reads,
) -> Vec<ClaimView> {
    let now = Instant::now();
    claims
        .iter()
        .map(|c| {
            let granted_to = (c.metadata.uid == holder.0)
                .then_some(holder.1.as_deref())
                .flatten();
            let confirmed = c.metadata.uid.as_ref().and_then(|u| reads.pods.get(u));
            let pod = confirmed
                .copied()
                .unwrap_or_else(|| pods::presence(c, &memory.pods, granted_to));
            claim_view(memory, c, pod, now)
        })
        .collect()
}

impl Gathered {
    pub(super) fn new(memory: &Memory, lease: &FencedLease) -> Gathered {
        let (ns, name) = (lease.namespace().unwrap_or_default(), lease.name_any());
        let claims = claims_of(memory, &ns, &name);
        let holder = holder_of(lease.status.as_ref());
        let views = views(memory, &claims, &holder, &Reads::default());
        Gathered {
            claims,
            views,
            holder,
        }
    }

    /// The claims and their views with what `reads` learnt from the API over the cached
    /// copies, for a lease held by `holder`; borrowed as gathered when nothing was read and
    /// the holder is the one gathered for.
    pub(super) fn overlaid(&self, memory: &Memory, reads: &Reads, holder: &Holder) -> Overlaid<'_> {
        if reads.fresh.is_empty() && reads.pods.is_empty() && *holder == self.holder {
            return (Cow::Borrowed(&self.claims), Cow::Borrowed(&self.views));
        }
        let claims = overlay(self.claims.clone(), &reads.fresh);
        let views = views(memory, &claims, holder, reads);
        (Cow::Owned(claims), Cow::Owned(views))
    }
}

/// Claims and their views, borrowed or overlaid.
pub(super) type Overlaid<'g> = (Cow<'g, [Arc<CachedClaim>]>, Cow<'g, [ClaimView]>);

/// The highest token any `Granted` claim shows.
pub fn newest_grant(claims: &[Arc<CachedClaim>]) -> i64 {
    claims
        .iter()
        .filter_map(|c| c.status.as_ref())
        .filter(|s| s.phase == Some(ClaimPhase::Granted))
        .filter_map(|s| s.fencing_token)
        .max()
        .unwrap_or(0)
}

fn claim_view(memory: &Memory, claim: &CachedClaim, pod: PodPresence, now: Instant) -> ClaimView {
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    ClaimView {
        name: claim.name_any(),
        last_beat: memory.heartbeats.last_change(&uid, now),
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

/// The claims of lease `ns/lease` in the cache, found by index.
pub fn claims_of(memory: &Memory, ns: &str, lease: &str) -> Vec<Arc<CachedClaim>> {
    memory
        .claims_by_lease
        .get(ns, lease)
        .into_iter()
        .filter_map(|name| memory.claims.get(ns, &name))
        .filter(|c| c.spec.lease_name == lease)
        .collect()
}

/// `claims` with those read from the API (`fresh`) in place of their cached copies.
fn overlay(claims: Vec<Arc<CachedClaim>>, fresh: &Fresh) -> Vec<Arc<CachedClaim>> {
    let mut claims: Vec<Arc<CachedClaim>> = claims
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
