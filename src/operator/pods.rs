//! Holder pods: whether the pod a claim names exists, and the token annotation on it.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use serde_json::json;

use super::context::Context;
use super::decide::PodPresence;
use super::error::{Result, timed};
use crate::api::{FencedLease, FencedLeaseClaim, token_annotation_key};

/// Does the pod `claim` names exist, as the cache says?
pub fn presence(claim: &FencedLeaseClaim, pods: &Store<PartialObjectMeta<Pod>>) -> PodPresence {
    let (Some(pod_name), Some(ns)) = (&claim.spec.pod_name, &claim.metadata.namespace) else {
        return PodPresence::NotNamed;
    };
    presence_of(
        claim,
        pods.get(&ObjectRef::new(pod_name).within(ns)).as_deref(),
    )
}

/// Does the pod `claim` names exist, asking the API rather than the cache? For decisions
/// that end a hold: a pod created after the cache last heard is not a deleted pod.
pub async fn confirmed_presence(ctx: &Context, claim: &FencedLeaseClaim) -> Result<PodPresence> {
    let (Some(pod_name), Some(ns)) = (&claim.spec.pod_name, &claim.metadata.namespace) else {
        return Ok(PodPresence::NotNamed);
    };
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let pod = timed("read pod", ctx.api_timeout, api.get_metadata_opt(pod_name)).await?;
    Ok(presence_of(claim, pod.as_ref()))
}

/// A pod of the claim's pod name with another UID than the one the claim is owned by is a
/// new pod (a StatefulSet replacement, say): the claim's pod is gone.
fn presence_of(claim: &FencedLeaseClaim, pod: Option<&PartialObjectMeta<Pod>>) -> PodPresence {
    let Some(pod) = pod else {
        return PodPresence::Missing;
    };
    let owner_uid = claim
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "Pod" && Some(&o.name) == claim.spec.pod_name.as_ref())
        .map(|o| o.uid.as_str());
    match owner_uid {
        Some(uid) if pod.metadata.uid.as_deref() != Some(uid) => PodPresence::Missing,
        _ => PodPresence::Present,
    }
}

/// Makes the pods of the lease's namespace carry its token annotation exactly when they hold
/// it: set on the holder's pod (if the lease annotates), removed from every other pod.
pub async fn repair_annotations(
    ctx: &Context,
    lease: &FencedLease,
    ns: &str,
    lease_name: &str,
) -> Result<()> {
    let key = token_annotation_key(lease_name);
    let status = lease.status.clone().unwrap_or_default();
    let wanted = status
        .holder
        .as_ref()
        .filter(|_| lease.spec.annotate_holder_pod && lease.metadata.deletion_timestamp.is_none())
        .and_then(|h| h.pod_name.clone())
        .map(|pod| (pod, status.fencing_token.to_string()));

    let pods = ctx.pods.state_filter(|p| {
        p.metadata.namespace.as_deref() == Some(ns)
            && (p
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(&key))
                || wanted
                    .as_ref()
                    .is_some_and(|(w, _)| p.metadata.name.as_ref() == Some(w)))
    });
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    for pod in pods {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let desired = wanted
            .as_ref()
            .filter(|(w, _)| *w == name)
            .map(|(_, token)| token.as_str());
        let current = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(&key))
            .map(String::as_str);
        if current == desired {
            continue;
        }
        let patch = json!({ "metadata": { "annotations": { key.clone(): desired } } });
        match timed(
            "annotate pod",
            ctx.api_timeout,
            api.patch_metadata(&name, &PatchParams::default(), &Patch::Merge(&patch)),
        )
        .await
        {
            Ok(_) => {
                tracing::debug!(pod = %name, lease = %lease_name, token = ?desired, "pod annotation set")
            }
            Err(e) if e.is_not_found() => {} // gone meanwhile; its claim is released by the pod watch
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
