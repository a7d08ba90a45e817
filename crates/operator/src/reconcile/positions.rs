//! The position writer: writes the queue positions the lease reconciles left
//! ([`state::positions`](crate::state::positions)) once they are due, one claim at a
//! time and paced, so that they never sit between a hand-over and the next, nor crowd the
//! apiserver while a queue moves.
//!
//! Each write is conditional on the `resourceVersion` of the claim's freshest cached copy,
//! and made only while that copy still waits with nothing but its place to change: a position
//! decided a while ago never overwrites a grant or an end written since. A conflict (the
//! claim changed after the cache last saw it: a heartbeat) is tried once more on the copy its
//! watch event brings; a second conflict sends the lease to be reconciled again.

use std::sync::Arc;
use std::time::Duration;

use kube::api::Api;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::claims::{self, Over};
use crate::context::{Context, Kube};
use crate::error::Result;
use crate::names::LeaseKey;
use crate::scheduler::Scheduler;
use crate::state::Memory;
use crate::state::positions;
use fenced_lease_api::{FencedLeaseClaim, FencedLeaseClaimStatus};

/// At most one position write per this long (100/s): a few percent of what the apiserver
/// takes here, the rest left to grants.
pub const PACE: Duration = Duration::from_millis(10);

/// Writes due positions until `stop`; leases whose positions conflicted go to `again`.
pub async fn write_due(ctx: Arc<Context>, again: Scheduler<LeaseKey>, stop: CancellationToken) {
    let (kube, memory) = (&ctx.kube, &ctx.memory);
    let mut pace = Pace(Instant::now());
    loop {
        let (due, next) = memory.positions.take_due(Instant::now());
        for (ns, lease, writes) in due {
            let api: Api<FencedLeaseClaim> = Api::namespaced(kube.client.clone(), &ns);
            for write in writes {
                if stop.is_cancelled() {
                    return;
                }
                let name = &write.claim;
                let mut result =
                    write_one(kube, memory, &api, (&ns, name), &write.status, &mut pace).await;
                if matches!(&result, Err(e) if e.is_conflict()) {
                    // The claim changed after the cache last saw it (a heartbeat): once more,
                    // on the copy its watch event brings.
                    tokio::time::sleep(PACE * 4).await;
                    result =
                        write_one(kube, memory, &api, (&ns, name), &write.status, &mut pace).await;
                }
                if let Err(e) = result {
                    if !e.is_conflict() {
                        ctx.metrics.error(e.metric_label());
                        tracing::debug!(lease = %lease, namespace = %ns, claim = %name, error = %e, "queue position not written");
                    }
                    again.reconcile(LeaseKey::new(&ns, &lease));
                    break;
                }
            }
        }
        let wake = next.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = memory.positions.changed.notified() => {}
            _ = tokio::time::sleep_until(wake) => {}
        }
    }
}

/// When the last write was sent: the next waits until [`PACE`] after it.
struct Pace(Instant);

impl Pace {
    async fn wait(&mut self) {
        tokio::time::sleep_until(self.0 + PACE).await;
        self.0 = Instant::now();
    }
}

/// Writes `status` on claim `ns/name` if its freshest cached copy still only waits for it,
/// paced (a claim that needs no write costs no wait).
async fn write_one(
    kube: &Kube,
    memory: &Memory,
    api: &Api<FencedLeaseClaim>,
    (ns, name): (&str, &str),
    status: &FencedLeaseClaimStatus,
    pace: &mut Pace,
) -> Result<()> {
    let Some(claim) = memory.claims.get(ns, name) else {
        return Ok(()); // gone
    };
    let stale = memory.written.is_superseded(
        claim.metadata.uid.as_deref(),
        claim.metadata.resource_version.as_deref(),
    );
    if stale || claim.metadata.deletion_timestamp.is_some() {
        return Ok(()); // written over since, or going: its reconcile decides again
    }
    let written = claim.status.as_ref().is_some_and(|s| s == status);
    if !written && positions::only_moved(claim.status.as_ref(), status) {
        pace.wait().await;
        claims::write(kube, memory, api, &claim, status, Over::Cached).await?;
    }
    Ok(())
}
