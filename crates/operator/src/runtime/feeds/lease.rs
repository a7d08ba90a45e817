//! The lease watch: fills kube-runtime's store (which the controller reads), triggers a
//! reconcile of each changed lease and a sweep after every (re)list, and forgets what the
//! operator kept of a deleted lease.

use std::sync::atomic::Ordering;

use futures::{Stream, TryStreamExt};
use kube::ResourceExt;
use kube::api::DynamicObject;
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};

use super::{Memory, Triggers, index_event, own_writes, reconcile};
use crate::context::Kube;
use crate::metrics::Metrics;
use crate::names::LeaseKey;
use crate::reconcile::orphans::{Left, Orphan};
use crate::runtime::watch;
use fenced_lease_api::FencedLease;

/// The lease watch of `namespaces` (all when empty), feeding `memory` through `writer`.
pub fn feed<U>(
    kube: &Kube,
    namespaces: &[String],
    unreadable: U,
    memory: &Memory,
    writer: reflector::store::Writer<FencedLease>,
    triggers: &Triggers,
    metrics: std::sync::Arc<Metrics>,
) -> impl Stream<Item = Result<watcher::Event<FencedLease>, watcher::Error>> + Send + use<U>
where
    U: Fn(&DynamicObject, &serde_json::Error) + Clone + Send + 'static,
{
    let config = watcher::Config::default();
    let (memory, triggers) = (memory.clone(), triggers.clone());
    watch::watch::<FencedLease>(kube.client.clone(), namespaces, config, unreadable)
        .modify(prune)
        .reflect(writer)
        .inspect_ok(move |event| {
            // A change: reconcile that lease now (not the operator's own write: the reconcile
            // that wrote it decided on everything before it).
            let trigger = match event {
                watcher::Event::Apply(lease) => reconcile(&triggers, vec![LeaseKey::of(lease)]),
                _ => None,
            };
            own_writes(
                &memory.written,
                event,
                |l| {
                    (
                        l.metadata.uid.as_deref(),
                        l.metadata.resource_version.as_deref(),
                    )
                },
                trigger,
            );
            index_event(
                &memory.followers,
                || memory.leases.state(),
                event,
                |l| l.spec.follow.iter().map(|f| f.lease.clone()).collect(),
            );
            match event {
                // A (re)list: every lease, as bulk work.
                watcher::Event::InitDone => {
                    memory.leases_listed.store(true, Ordering::Release);
                    triggers.leases.sweep();
                }
                watcher::Event::Delete(lease) => gone(&memory, &triggers, &metrics, lease),
                _ => {}
            }
        })
}

/// Forgets a deleted lease's metrics and queue positions, and sends what it left behind
/// (token annotations on pods, its kinds' places in the kinds slots) to be removed.
fn gone(memory: &Memory, triggers: &Triggers, metrics: &Metrics, lease: &FencedLease) {
    let (ns, name) = (lease.namespace().unwrap_or_default(), lease.name_any());
    metrics.transitions.forget(&ns, &name);
    memory.positions.forget(&ns, &name);
    let pods = memory.pods_by_lease.get(&ns, &name).into_iter();
    let left = pods
        .map(|pod| Left::Annotation { pod })
        .chain([Left::FenceSlots]);
    for left in left {
        let _ = triggers.orphans.send(Orphan {
            namespace: ns.clone(),
            lease: name.clone(),
            left,
        });
    }
}

/// Memory stays small with many objects: nothing the operator never reads is cached. Its
/// writes never carry these fields back: status writes go to the status subresource (which
/// keeps the rest of the object as stored), the rest are patches of the fields they set.
pub fn prune(lease: &mut FencedLease) {
    let meta = &mut lease.metadata;
    meta.managed_fields = None;
    meta.labels = None;
    meta.annotations = None;
    meta.generate_name = None;
    meta.self_link = None;
    meta.owner_references = None;
}
