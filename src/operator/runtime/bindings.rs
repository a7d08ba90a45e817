//! The watch of the operator's fence bindings: fills the [`BindingCache`], sends the lease of a
//! binding someone else changed or deleted to be reconciled (which puts it back), and deletes
//! the bindings of leases that are gone after every (re)list and every five minutes.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding;
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
use crate::operator::state::BindingCache;

/// Watches the operator's bindings (only those of `namespaces` when the operator watches
/// some, all when empty) into `cache` through `writer` until `stop`.
pub fn watch(
    kube: Kube,
    namespaces: &[String],
    cache: BindingCache,
    writer: Writer<ValidatingAdmissionPolicyBinding>,
    triggers: UnboundedSender<ObjectRef<FencedLease>>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let mut labels = format!("{}={}", MANAGED_BY.0, MANAGED_BY.1);
    if !namespaces.is_empty() {
        let served = namespaces.join(",");
        labels.push_str(&format!(",{LEASE_NAMESPACE_LABEL} in ({served})"));
    }
    let api: Api<ValidatingAdmissionPolicyBinding> = Api::all(kube.client.clone());
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
                        warn!(watch = "validatingadmissionpolicybindings", error = %e, "watch failed; retrying with backoff")
                    }
                },
                _ = sweep.tick() => {
                    tokio::spawn(remove_orphans(kube.clone(), cache.all()));
                }
            }
        }
    })
}

/// Deletes the bindings whose lease the API says does not exist (deleted while no operator
/// ran its finalizer, say). A binding re-created meanwhile (another UID) is left alone.
async fn remove_orphans(kube: Kube, bindings: Vec<Arc<ValidatingAdmissionPolicyBinding>>) {
    let api: Api<ValidatingAdmissionPolicyBinding> = Api::all(kube.client.clone());
    for binding in bindings {
        let labels = binding.labels();
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
                warn!(lease = %name, namespace = %ns, error = %e, "cannot check the lease of a fence binding");
                continue;
            }
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: binding.uid(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        let binding_name = binding.name_any();
        match timed(
            "delete fence binding",
            kube.timeout,
            api.delete(&binding_name, &params),
        )
        .await
        {
            Ok(_) => {
                info!(lease = %name, namespace = %ns, binding = %binding_name, "deleted the fence binding of a lease that is gone")
            }
            Err(e) if e.is_not_found() || e.is_conflict() => {}
            Err(e) => {
                warn!(binding = %binding_name, error = %e, "cannot delete the fence binding of a lease that is gone")
            }
        }
    }
}
