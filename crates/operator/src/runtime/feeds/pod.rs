//! The pod watch (metadata only): fills the pod cache and the index of token annotations,
//! triggers the leases a pod event concerns, and sends annotations of leases that are gone
//! to be removed.

use futures::{Stream, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::{WatchStreamExt, watcher};

use super::{Memory, Triggers, index_event, is_listed, last_known, own_writes, reconcile, touched};
use crate::context::Kube;
use crate::names::LeaseKey;
use crate::reconcile::orphans::{Left, Orphan};
use crate::runtime::merge;
use crate::state::CachedPod;
use crate::state::cache::{Writer, map_event};

/// The pod watch of `namespaces` (all when empty), feeding `memory` through `writer`.
pub fn feed(
    kube: &Kube,
    namespaces: &[String],
    memory: &Memory,
    mut writer: Writer<CachedPod>,
    triggers: &Triggers,
) -> impl Stream<Item = Result<watcher::Event<CachedPod>, watcher::Error>> + Send + use<> {
    let client = kube.client.clone();
    let (memory, triggers) = (memory.clone(), triggers.clone());
    let cached = memory.pods.clone();
    merge::each_namespace(namespaces, move |namespace| {
        let api: Api<PartialObjectMeta<Pod>> = match namespace {
            Some(ns) => Api::namespaced(client.clone(), &ns),
            None => Api::all(client.clone()),
        };
        watcher(api, watcher::Config::default()).default_backoff()
    })
    .map_ok(|event| map_event(event, CachedPod::from_meta))
    .map_ok(move |event| last_known(&cached, event, |p| p.uid.as_deref()))
    .inspect_ok(move |event| writer.apply(event))
    .inspect_ok(move |event| {
        index_event(
            &memory.pods_by_lease,
            || memory.pods.state(),
            event,
            CachedPod::leases,
        );
        if matches!(event, watcher::Event::InitDone) {
            triggers.leases.sweep();
        }
        let mut reconciles = vec![];
        for pod in touched(event) {
            for lease in leases_of_pod(&memory, pod) {
                if memory.leases.get(&lease.object_ref()).is_none()
                    && pod.token(lease.name()).is_some()
                {
                    let _ = triggers.orphans.send(Orphan {
                        namespace: lease.namespace().to_owned(),
                        lease: lease.name().to_owned(),
                        left: Left::Annotation {
                            pod: pod.name.clone(),
                        },
                    });
                }
                if !is_listed(event) {
                    reconciles.push(lease);
                }
            }
        }
        // Not for the operator's own annotation: the reconcile that wrote it is done with it.
        let trigger = reconcile(&triggers, reconciles);
        own_writes(
            &memory.written,
            event,
            |p| (p.uid.as_deref(), p.resource_version.as_deref()),
            trigger,
        );
    })
}

/// Leases a pod event concerns: those it carries a token annotation of, those whose claims
/// name it, and those following a Lease its holder identity may name it by (found by index,
/// not by a scan of every claim or Lease).
fn leases_of_pod(memory: &Memory, pod: &CachedPod) -> Vec<LeaseKey> {
    let (ns, name) = (pod.namespace.as_str(), pod.name.as_str());
    let annotated = pod
        .leases()
        .into_iter()
        .map(|lease| LeaseKey::new(ns, &lease));
    let claimed = memory
        .claims_by_pod
        .get(ns, name)
        .into_iter()
        .filter_map(|claim| memory.claims.get(ns, &claim))
        .filter(|c| c.spec.pod_name.as_deref() == Some(name))
        .map(|c| LeaseKey::new(ns, &c.spec.lease_name));
    let followed = memory
        .followed_by_pod
        .get(ns, name)
        .into_iter()
        .flat_map(|lease| memory.followers.get(ns, &lease))
        .map(|lease| LeaseKey::new(ns, &lease));
    annotated.chain(claimed).chain(followed).collect()
}
