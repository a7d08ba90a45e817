//! Making the cluster match the decisions: the FencedLease reconciler ([`lease`]: a lease's
//! trip, its status written, the linearization point; [`claims`]: its claims' statuses), and
//! what it calls: [`finalizer`] (the finalizer's whole cycle, and the token records that keep
//! tokens growing across deletion of a lease), [`expire`] (an expiry confirmed on a fresh read
//! and made final, I9), [`pods`] (pod presence and token annotations), `follow` (the
//! coordination Lease a lease follows, and the pod its holder is). Apart: [`missing_lease`]
//! (claims of leases that do not exist), [`orphans`] (token annotations of leases that are
//! gone) and [`positions`] (waiters' queue positions, written off the hand-over's path).

use std::future::Future;
use std::time::Duration;

use crate::context::Kube;
use crate::error::{Result, timed};
use crate::state::Memory;

pub mod claims;
pub mod expire;
pub mod finalizer;
#[cfg(test)]
mod fixtures;
mod follow;
mod gather;
pub mod lease;
mod lookup;
pub mod missing_lease;
pub mod orphans;
pub mod pods;
pub mod positions;
pub mod report;
mod write_status;

/// Sends `call` (`what`), a write of object `uid` read at version `before`, within the API
/// deadline and through [`OwnWrites::around`](crate::state::own_writes::OwnWrites::around):
/// every write of an object the operator watches goes this way.
async fn write_watched<K: kube::Resource>(
    kube: &Kube,
    memory: &Memory,
    what: &'static str,
    uid: Option<&str>,
    before: Option<&str>,
    call: impl Future<Output = kube::Result<K>>,
) -> Result<K> {
    let write = timed(what, kube.timeout, call);
    memory.written.around(uid, before, write).await
}

/// When a reconcile asks to look at its object again: after this long at the latest (sooner
/// if something changes), or, `None`, only when something changes.
pub type Again = Option<Duration>;
