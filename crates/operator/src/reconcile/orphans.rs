//! What leases that are gone left behind. A lease deleted while its finalizer could not run
//! (stripped by hand, the operator down) leaves its token on the holder's pod; so does a pod
//! the operator meets for the first time carrying the token of a lease that no longer exists.
//! It is removed once the API confirms the lease is gone, because only a pod that holds the
//! lease carries its token (I5). A lease's kinds leave the kinds slots when it goes (the
//! slots' keeper reads the cache), so that nothing a lease left refuses a write (I12) even
//! while the apiserver cannot read FencedLeases.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::lookup::lease_exists;
use super::pods::set_annotation;
use crate::context::Context;
use fenced_lease_api::token_annotation_key;

/// Something left behind by lease `namespace/lease`, which the cache does not know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Orphan {
    pub namespace: String,
    pub lease: String,
    pub left: Left,
}

/// What a lease that is gone may have left behind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Left {
    /// Its token annotation on this pod.
    Annotation { pod: String },
    /// Its kinds' places in the kinds slots (unless another lease there fences them too).
    FenceSlots,
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
        if let Err(error) = remove_if_gone(&ctx, &orphan).await {
            warn!(left = ?orphan.left, namespace = %orphan.namespace, lease = %orphan.lease, %error, "cannot remove what a deleted lease left behind");
        }
    }
}

async fn remove_if_gone(ctx: &Context, orphan: &Orphan) -> crate::error::Result<()> {
    let Orphan {
        namespace: ns,
        lease,
        left,
    } = orphan;
    let pod = match left {
        Left::Annotation { pod } => pod,
        Left::FenceSlots => {
            // The keeper of the kinds slots reads the cache: no call.
            ctx.admission.forget(ns, lease);
            return Ok(());
        }
    };
    if lease_exists(&ctx.kube, &ctx.memory, ns, lease).await? {
        return Ok(()); // the lease reconciler owns these
    }
    let key = token_annotation_key(lease);
    let Some(cached) = ctx.memory.pods.get(ns, pod) else {
        return Ok(());
    };
    if cached.token(lease).is_none() {
        return Ok(());
    }
    let api: Api<Pod> = Api::namespaced(ctx.kube.client.clone(), ns);
    set_annotation(&ctx.kube, &ctx.memory, &api, &cached, &key, None).await?;
    info!(pod = %pod, namespace = %ns, lease = %lease, "removed the token annotation of a lease that no longer exists");
    Ok(())
}
