//! Reconciling every lease (once the caches have synced, and after every relist) without
//! flooding the controller. The controller starts the reconciles that wait for a free slot in
//! the order they came, so a change queued behind thousands (a new claim of another lease)
//! would wait for all of them. The sweep keeps at most `limit` leases queued or reconciling,
//! fewer than the controller's slots, so a fresh change always finds a free slot.
//!
//! The leases being deleted are paced the same way, and in the same slots: each deletion is a
//! change, and each takes several writes to finalize (its last token recorded, its holder
//! revoked, its finalizer removed), so a namespace of thousands deleted at once must not take
//! every slot.

use crate::operator::state::Swept;
use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::share::{NAMESPACE_SHARE, Turn, Waiting};
use crate::api::FencedLease;
use crate::operator::context::Context;
use crate::operator::names::{joined_name, split_name};

/// How often the sweep looks whether it may queue more.
const POLL: Duration = Duration::from_millis(5);
/// Queued leases gone from the cache for this long are no longer waited for.
const PRUNE: Duration = Duration::from_secs(1);

/// Queues every lease on `triggers` each time `requests` asks (requests that arrive during a
/// sweep fold into one more sweep), with at most `limit` queued or reconciling, and a
/// namespace's share of them at most, until `stop`.
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
        // Requests made until now (the lease, claim and pod lists all end at the start) are
        // served by this sweep.
        while requests.try_recv().is_ok() {}
        let (store, swept) = (&ctx.leases, &ctx.swept);
        // Namespace and name in one string each, a third of an object reference's size, and
        // the leases themselves are not kept alive by the list.
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
            while swept.len() >= limit || swept.in_namespace(ns) >= NAMESPACE_SHARE {
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

/// Passes every lease trigger from `input` on to `output` (the controller): those of leases
/// being deleted wait, first come first served, for one of the `limit` slots the sweep also
/// uses (and for the lease's own reconcile in one of them to finish), so that a mass deletion
/// never holds more of the controller than the sweep does; the others go at once while their
/// namespace is within its share ([`share`](super::share)), and wait their turn beyond it;
/// those of `due` (wake-ups at a holder's deadline) at the front of their namespace's turn.
/// Until `stop`.
pub async fn route(
    ctx: Arc<Context>,
    limit: usize,
    (mut input, mut due): (
        mpsc::UnboundedReceiver<ObjectRef<FencedLease>>,
        mpsc::UnboundedReceiver<ObjectRef<FencedLease>>,
    ),
    output: mpsc::UnboundedSender<ObjectRef<FencedLease>>,
    stop: CancellationToken,
) {
    let mut deleting = Deleting::default();
    let mut waiting = Waiting::default();
    let mut pruned = Instant::now();
    loop {
        let idle = deleting.is_empty() && waiting.is_empty();
        tokio::select! {
            () = stop.cancelled() => return,
            next = due.recv() => {
                let Some(lease) = next else { return };
                if !pass(&ctx, &mut deleting, &mut waiting, lease, Turn::First, &output) {
                    return;
                }
            }
            next = input.recv() => {
                let Some(lease) = next else { return };
                if !pass(&ctx, &mut deleting, &mut waiting, lease, Turn::Last, &output) {
                    return;
                }
            }
            () = tokio::time::sleep(POLL), if !idle => {}
        }
        if deleting.is_empty() && waiting.is_empty() {
            continue;
        }
        if pruned.elapsed() >= PRUNE {
            ctx.swept.prune(&ctx.leases);
            pruned = Instant::now();
        }
        let waited = waiting.release(&ctx.swept, &ctx.leases, NAMESPACE_SHARE);
        let deleted = deleting.release(&ctx.swept, &ctx.leases, limit, NAMESPACE_SHARE);
        for lease in waited.into_iter().chain(deleted) {
            if output.send(lease).is_err() {
                return;
            }
        }
    }
}

/// Sends `lease` on to `output` now, or keeps it for its turn; false once `output` is closed.
fn pass(
    ctx: &Context,
    deleting: &mut Deleting,
    waiting: &mut Waiting,
    lease: ObjectRef<FencedLease>,
    turn: Turn,
    output: &mpsc::UnboundedSender<ObjectRef<FencedLease>>,
) -> bool {
    if ctx
        .leases
        .get(&lease)
        .is_some_and(|l| l.metadata.deletion_timestamp.is_some())
    {
        deleting.push(lease);
        return true;
    }
    match waiting.admit(lease, turn, &ctx.swept, &ctx.leases, NAMESPACE_SHARE) {
        Some(lease) => output.send(lease).is_ok(),
        None => true,
    }
}

/// Triggers of leases being deleted, waiting for a slot: each lease once, oldest first.
#[derive(Default)]
struct Deleting {
    order: VecDeque<ObjectRef<FencedLease>>,
    held: HashSet<ObjectRef<FencedLease>>,
}

impl Deleting {
    fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    fn push(&mut self, lease: ObjectRef<FencedLease>) {
        if self.held.insert(lease.clone()) {
            self.order.push_back(lease);
        }
    }

    /// The leases that may be reconciled now, each queued in `swept`: oldest first, as many as
    /// `limit` leaves room for and their namespace's `share` (the other changes of that
    /// namespace are served first), none whose last reconcile there has not finished (it goes
    /// to the back), none the cache no longer has (dropped: there is nothing left to finalize).
    fn release(
        &mut self,
        swept: &Swept,
        store: &Store<FencedLease>,
        limit: usize,
        share: usize,
    ) -> Vec<ObjectRef<FencedLease>> {
        let mut released = Vec::new();
        for _ in 0..self.order.len().min(2 * limit) {
            if swept.len() >= limit {
                break;
            }
            let Some(lease) = self.order.pop_front() else {
                break;
            };
            let ns = lease.namespace.as_deref().unwrap_or_default();
            if store.get(&lease).is_none() {
                self.held.remove(&lease);
            } else if swept.contains(&lease) || swept.in_namespace(ns) >= share {
                self.order.push_back(lease);
            } else {
                self.held.remove(&lease);
                swept.queue(lease.clone());
                released.push(lease);
            }
        }
        released
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

    fn store_of(names: &[&str]) -> Store<FencedLease> {
        let (store, mut writer) = kube::runtime::reflector::store::<FencedLease>();
        for name in names {
            let lease: FencedLease = serde_json::from_value(serde_json::json!({
                "apiVersion": "fencing.dev/v1alpha1", "kind": "FencedLease",
                "metadata": {"name": name, "namespace": "ns"},
                "spec": {"leaseDurationSeconds": 10},
            }))
            .expect("lease");
            writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(lease));
        }
        store
    }

    fn lease(name: &str) -> ObjectRef<FencedLease> {
        ObjectRef::new(name).within("ns")
    }

    #[test]
    fn deletions_take_free_slots_oldest_first_and_each_lease_once() {
        let store = store_of(&["a", "b", "c", "d"]);
        let (swept, mut deleting) = (Swept::default(), Deleting::default());
        for name in ["a", "b", "a", "c", "d"] {
            deleting.push(lease(name));
        }
        swept.queue(lease("x"));
        let first = deleting.release(&swept, &store, 3, 3);
        assert_eq!(
            first,
            vec![lease("a"), lease("b")],
            "two free slots of three"
        );
        assert!(
            deleting.release(&swept, &store, 3, 3).is_empty(),
            "no slot free"
        );
        swept.finished(&lease("a"));
        assert_eq!(deleting.release(&swept, &store, 3, 3), vec![lease("c")]);
        swept.finished(&lease("b"));
        swept.finished(&lease("c"));
        assert_eq!(deleting.release(&swept, &store, 3, 3), vec![lease("d")]);
        assert!(deleting.is_empty());
    }

    #[test]
    fn a_deletion_waits_for_its_own_running_reconcile_and_a_gone_lease_is_dropped() {
        let store = store_of(&["a", "b"]);
        let (swept, mut deleting) = (Swept::default(), Deleting::default());
        swept.queue(lease("a"));
        deleting.push(lease("a"));
        deleting.push(lease("b"));
        deleting.push(lease("gone"));
        assert_eq!(deleting.release(&swept, &store, 10, 10), vec![lease("b")]);
        assert!(!deleting.is_empty(), "a waits for its reconcile to finish");
        swept.finished(&lease("a"));
        assert_eq!(deleting.release(&swept, &store, 10, 10), vec![lease("a")]);
        assert!(deleting.is_empty(), "the lease the cache lacks is dropped");
    }
}
