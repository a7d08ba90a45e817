//! The watches of the admission objects shipped (by their labels) into the caches [`Admission`]
//! reads. A change after the first list, anyone's, has the keeper of the slots look again and
//! the leases it concerns reconciled: a slot newly listing a namespace lets its leases be
//! granted once settled; an object deleted or edited by hand holds up the leases it fenced.

use std::collections::BTreeSet;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::reflector::Store;
use kube::runtime::reflector::store::Writer;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::Admission;
use super::shipped::{self, LABELS};
use crate::names::LeaseKey;
use crate::scheduler::Scheduler;
use fenced_lease_api::FencedLease;

/// What a watch of admission objects reads and tells.
#[derive(Clone)]
pub struct Feed {
    pub client: Client,
    pub admission: Admission,
    pub leases: Store<FencedLease>,
    pub triggers: Scheduler<LeaseKey>,
    pub stop: CancellationToken,
}

/// Watches the shipped admission objects of kind `K` into `writer` until `stop`; a change
/// pokes the keeper of `admission` and reconciles the leases of `leases` it may concern.
pub fn watch<K>(writer: Writer<K>, feed: Feed) -> tokio::task::JoinHandle<()>
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + DeserializeOwned + Send + Sync,
    K: 'static,
{
    let labels: Vec<String> = LABELS.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let config = watcher::Config::default().labels(&labels.join(","));
    let Feed {
        client,
        admission,
        leases,
        triggers,
        stop,
    } = feed;
    let stream = watcher(Api::<K>::all(client), config)
        .default_backoff()
        .reflect(writer)
        .take_until(stop.cancelled_owned());
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Apply(o) | watcher::Event::Delete(o)) => {
                    admission.poke.notify_one();
                    concerned(&admission, &leases, &o.name_any(), &triggers);
                }
                Ok(watcher::Event::InitDone) => {
                    {
                        let mut state = admission.lock();
                        state.listed_kinds.insert(K::kind(&()).to_string());
                        state.unreadable = None;
                    }
                    admission.poke.notify_one();
                    concerned(&admission, &leases, "", &triggers);
                }
                Ok(_) => {}
                Err(e) => {
                    warn!(kind = %K::kind(&()), error = %e, "watch failed; retrying with backoff");
                    let unlisted = !admission
                        .lock()
                        .listed_kinds
                        .contains(K::kind(&()).as_ref());
                    if unlisted {
                        // The leases that wait on it say why.
                        admission.lock().unreadable = Some(format!("{}: {e}", K::kind(&())));
                        concerned(&admission, &leases, "", &triggers);
                    }
                }
            }
        }
    })
}

/// Reconciles the leases a change of object `name` may concern: those whose fence waits on the
/// slots (listed or pending), when it is a slot; every lease that fences anything when not.
fn concerned(
    admission: &Admission,
    leases: &Store<FencedLease>,
    name: &str,
    triggers: &Scheduler<LeaseKey>,
) {
    let slot = shipped::slot_names().iter().any(|s| s == name);
    let (listed, pending) = {
        let mut state = admission.lock();
        let listed: BTreeSet<_> = state.listed.keys().cloned().collect();
        (listed, std::mem::take(&mut state.pending))
    };
    for lease in leases.state() {
        let ns = lease.namespace().unwrap_or_default();
        let fenced = if slot {
            pending.contains(&(ns.clone(), lease.name_any()))
                || (lease.spec.fence.iter().flat_map(|f| &f.resources))
                    .any(|k| listed.contains(&(k.clone(), ns.clone())))
        } else {
            lease.spec.fence_objects || lease.spec.fence.is_some()
        };
        if fenced {
            triggers.reconcile(LeaseKey::of(&lease));
        }
    }
}
