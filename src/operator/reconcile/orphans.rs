//! Token annotations of leases that are gone. A lease deleted while its finalizer could not
//! run (stripped by hand, the operator down) leaves its token on the holder's pod; so does a
//! pod the operator meets for the first time carrying the token of a lease that no longer
//! exists. Such an annotation is removed once the API confirms the lease is gone (I5: only a
//! pod that holds the lease carries its token).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::lookup::lease_exists;
use super::pods::set_annotation;
use crate::api::token_annotation_key;
use crate::operator::context::Context;

/// A pod that carries the token annotation of a lease the cache does not know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Orphan {
    pub namespace: String,
    pub pod: String,
    pub lease: String,
}

/// Removes orphaned annotations until `stop`.
pub async fn sweep(
    ctx: Arc<Context>,
    mut orphans: UnboundedReceiver<Orphan>,
    stop: CancellationToken,
) {
    loop {
        let orphan = tokio::select! {
            () = stop.cancelled() => return,
            o = orphans.recv() => match o { Some(o) => o, None => return },
        };
        while !ctx.is_synced() {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
        }
        if let Err(error) = remove_if_gone(&ctx, &orphan).await {
            warn!(pod = %orphan.pod, namespace = %orphan.namespace, lease = %orphan.lease, %error, "cannot remove the token annotation of a deleted lease");
        }
    }
}

async fn remove_if_gone(ctx: &Context, orphan: &Orphan) -> crate::operator::error::Result<()> {
    let Orphan {
        namespace: ns,
        pod,
        lease,
    } = orphan;
    if lease_exists(ctx, ns, lease).await? {
        return Ok(()); // the lease reconciler owns this annotation
    }
    let key = token_annotation_key(lease);
    let Some(cached) = ctx.pods.get(ns, pod) else {
        return Ok(());
    };
    if cached.token(lease).is_none() {
        return Ok(());
    }
    let api: Api<Pod> = Api::namespaced(ctx.kube.client.clone(), ns);
    set_annotation(ctx, &api, &cached, &key, None).await?;
    info!(pod = %pod, namespace = %ns, lease = %lease, "removed the token annotation of a lease that no longer exists");
    Ok(())
}
