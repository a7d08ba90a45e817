//! The watches of the operator's fence bindings and policies: each fills its cache
//! ([`FenceObjects`]), sends the lease of an object someone else changed or deleted to be
//! reconciled (which puts it back), and deletes the objects of leases that are gone after
//! every (re)list and every five minutes.

use std::sync::Arc;

use futures::StreamExt;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Preconditions};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::reflector::store::Writer;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::api::FencedLease;
use crate::operator::context::Kube;
use crate::operator::core::fence::{
    LEASE_NAME_LABEL, LEASE_NAMESPACE_LABEL, MANAGED_BY, ORPHAN_SWEEP,
};
use crate::operator::error::timed;
use crate::operator::state::bindings::{FenceObject, FenceObjects};

/// Watches the operator's objects of kind `K` (only those of `namespaces` when the operator
/// watches some, all when empty) into `cache` through `writer` until `stop`.
pub fn watch<K: FenceObject>(
    kube: Kube,
    namespaces: &[String],
    cache: FenceObjects<K>,
    writer: Writer<K>,
    triggers: UnboundedSender<ObjectRef<FencedLease>>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let mut labels = format!("{}={}", MANAGED_BY.0, MANAGED_BY.1);
    if !namespaces.is_empty() {
        let served = namespaces.join(",");
        labels.push_str(&format!(",{LEASE_NAMESPACE_LABEL} in ({served})"));
    }
    let api: Api<K> = Api::all(kube.client.clone());
    let stream = watcher(api, watcher::Config::default().labels(&labels))
        .default_backoff()
        .reflect(writer);
    tokio::spawn(async move {
        let stream = stream.take_until(stop.cancelled_owned());
        futures::pin_mut!(stream);
        let mut sweep = tokio::time::interval(ORPHAN_SWEEP);
        sweep.tick().await; // the first tick is immediate; the first list sweeps
        loop {
            tokio::select! {
                event = stream.next() => match event {
                    None => break,
                    Some(Ok(watcher::Event::InitDone)) => {
                        tokio::spawn(remove_orphans(kube.clone(), cache.all()));
                    }
                    Some(Ok(watcher::Event::Apply(b) | watcher::Event::Delete(b))) => {
                        let labels = b.labels();
                        if let (Some(ns), Some(lease)) =
                            (labels.get(LEASE_NAMESPACE_LABEL), labels.get(LEASE_NAME_LABEL))
                        {
                            let _ = triggers.send(ObjectRef::new(lease).within(ns));
                        }
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => {
                        warn!(watch = K::WHAT, error = %e, "watch failed; retrying with backoff")
                    }
                },
                _ = sweep.tick() => {
                    tokio::spawn(remove_orphans(kube.clone(), cache.all()));
                }
            }
        }
    })
}

/// Deletes the objects whose lease the API says does not exist (deleted while no operator
/// ran its finalizer, say). One re-created meanwhile (another UID) is left alone.
async fn remove_orphans<K: FenceObject>(kube: Kube, objects: Vec<Arc<K>>) {
    let api: Api<K> = Api::all(kube.client.clone());
    for object in objects {
        let labels = object.labels();
        let (Some(ns), Some(name)) = (
            labels.get(LEASE_NAMESPACE_LABEL),
            labels.get(LEASE_NAME_LABEL),
        ) else {
            continue;
        };
        let leases: Api<FencedLease> = Api::namespaced(kube.client.clone(), ns);
        match timed("read lease", kube.timeout, leases.get_opt(name)).await {
            Ok(None) => {}
            Ok(Some(_)) => continue,
            Err(e) => {
                warn!(lease = %name, namespace = %ns, error = %e, what = K::WHAT, "cannot check the lease of a fence object");
                continue;
            }
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: object.uid(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        let object_name = object.name_any();
        match timed(
            "delete fence object",
            kube.timeout,
            api.delete(&object_name, &params),
        )
        .await
        {
            Ok(_) => {
                info!(lease = %name, namespace = %ns, object = %object_name, what = K::WHAT, "deleted a fence object of a lease that is gone")
            }
            Err(e) if e.is_not_found() || e.is_conflict() => {}
            Err(e) => {
                warn!(object = %object_name, what = K::WHAT, error = %e, "cannot delete a fence object of a lease that is gone")
            }
        }
    }
}
