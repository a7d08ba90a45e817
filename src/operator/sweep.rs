//! Reconciling every lease (once the caches have synced, and after every relist) without
//! flooding the controller. kube-runtime keeps the reconciles that wait for a free slot in a
//! hash set and starts the first in hash order, so with thousands queued at once a change
//! that arrives meanwhile (a new claim of another lease) can wait behind all of them: 20 s
//! and more at 10,000 leases. The sweep keeps at most `limit` leases queued or reconciling,
//! fewer than the controller's slots, so a fresh change always finds a free slot.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::context::{Context, joined_name, split_name};
use crate::api::FencedLease;

/// How often the sweep looks whether it may queue more.
const POLL: Duration = Duration::from_millis(5);
/// Queued leases gone from the cache for this long are no longer waited for.
const PRUNE: Duration = Duration::from_secs(1);

/// Leases the sweep has queued whose reconcile has not finished yet.
#[derive(Default)]
pub struct Swept {
    queued: Mutex<HashSet<ObjectRef<FencedLease>>>,
}

impl Swept {
    /// A reconcile of `lease` finished.
    pub fn finished(&self, lease: &ObjectRef<FencedLease>) {
        let mut queued = self.queued.lock().unwrap_or_else(|p| p.into_inner());
        if !queued.is_empty() {
            queued.remove(lease);
        }
    }

    fn len(&self) -> usize {
        self.queued.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    fn queue(&self, lease: ObjectRef<FencedLease>) -> bool {
        self.queued
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(lease)
    }

    /// Stops waiting for leases the cache no longer has (deleted: never reconciled).
    fn prune(&self, store: &Store<FencedLease>) {
        self.queued
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|lease| store.get(lease).is_some());
    }
}

/// Queues every lease on `triggers` each time `requests` asks (requests that arrive during a
/// sweep fold into one more sweep), with at most `limit` queued or reconciling, until `stop`.
pub async fn run(
    ctx: Arc<Context>,
    limit: usize,
    mut requests: mpsc::Receiver<()>,
    triggers: mpsc::UnboundedSender<ObjectRef<FencedLease>>,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            request = requests.recv() => if request.is_none() { return },
        }
        // Reconciles before the caches have synced only requeue themselves.
        while !ctx.is_synced() {
            if stop.is_cancelled() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Requests made until now (the lease, claim and pod lists all end at the start) are
        // served by this sweep.
        while requests.try_recv().is_ok() {}
        let (store, swept) = (&ctx.leases, &ctx.swept);
        // Namespace and name in one string each: at 10,000 leases this list is ~0.5 MiB, as
        // object references ~1.5 MiB, and the leases themselves would be kept alive by it.
        let leases: Vec<Box<str>> = store
            .state()
            .iter()
            .map(|l| {
                let ns = l.metadata.namespace.as_deref().unwrap_or_default();
                let name = l.metadata.name.as_deref().unwrap_or_default();
                joined_name(ns, name).into_boxed_str()
            })
            .collect();
        let total = leases.len();
        let started = Instant::now();
        let mut pruned = Instant::now();
        for key in leases {
            let Some((ns, name)) = split_name(&key) else {
                continue;
            };
            let lease = ObjectRef::new(name).within(ns);
            while swept.len() >= limit {
                if stop.is_cancelled() {
                    return;
                }
                if pruned.elapsed() >= PRUNE {
                    swept.prune(store);
                    pruned = Instant::now();
                }
                tokio::time::sleep(POLL).await;
            }
            if swept.queue(lease.clone()) && triggers.send(lease).is_err() {
                return;
            }
        }
        tracing::info!(
            leases = total,
            elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            "every lease queued for a reconcile"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_finished_reconcile_frees_its_place() {
        let swept = Swept::default();
        let lease = ObjectRef::<FencedLease>::new("a").within("ns");
        assert!(swept.queue(lease.clone()));
        assert!(!swept.queue(lease.clone()), "queued once");
        assert_eq!(swept.len(), 1);
        swept.finished(&lease);
        assert_eq!(swept.len(), 0);
    }
}
