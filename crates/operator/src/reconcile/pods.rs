//! Holder pods: whether the pod a claim names exists, and the token annotation on it.

use super::write_watched;
use crate::state::CachedPod;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::context::Kube;
use crate::core::decide::PodPresence;
use crate::error::{Result, timed};
use crate::state::Memory;
use crate::state::cache::Cache;
use crate::state::claim::CachedClaim;
use fenced_lease_api::{FencedLease, token_annotation_key};

/// Does the pod `claim` names exist, as the cache says? `granted_to` is the pod UID its
/// grant was made to, if it holds the lease.
pub fn presence(
    claim: &CachedClaim,
    pods: &Cache<CachedPod>,
    granted_to: Option<&str>,
) -> PodPresence {
    let (Some(pod_name), Some(ns)) = (&claim.spec.pod_name, &claim.metadata.namespace) else {
        return PodPresence::NotNamed;
    };
    presence_of(claim, pods.get(ns, pod_name).as_deref(), granted_to)
}

/// Does the pod `claim` names exist, asking the API rather than the cache? For decisions
/// that end a hold: a pod created after the cache last heard is not a deleted pod.
pub async fn confirmed_presence(
    kube: &Kube,
    claim: &CachedClaim,
    granted_to: Option<&str>,
) -> Result<PodPresence> {
    let (Some(pod_name), Some(ns)) = (&claim.spec.pod_name, &claim.metadata.namespace) else {
        return Ok(PodPresence::NotNamed);
    };
    let api: Api<Pod> = Api::namespaced(kube.client.clone(), ns);
    let pod = timed("read pod", kube.timeout, api.get_metadata_opt(pod_name)).await?;
    Ok(presence_of(
        claim,
        pod.map(CachedPod::from_meta).as_ref(),
        granted_to,
    ))
}

/// The UID of the pod a claim belongs to: its Pod ownerReference's, else the UID of the pod
/// of that name now (from the cache). Recorded at the grant, checked on every later decision.
pub fn pod_uid(claim: &CachedClaim, pods: &Cache<CachedPod>) -> Option<String> {
    let (pod_name, ns) = (
        claim.spec.pod_name.as_ref()?,
        claim.metadata.namespace.as_ref()?,
    );
    claim
        .pod_owner_uid
        .as_deref()
        .map(str::to_owned)
        .or_else(|| pods.get(ns, pod_name)?.uid.clone())
}

/// A pod of the claim's pod name with another UID than the one the claim is owned by, or
/// the one its grant was made to, is a new pod (a StatefulSet replacement after a force
/// delete, say): the claim's pod is gone, and the new one inherits nothing.
fn presence_of(
    claim: &CachedClaim,
    pod: Option<&CachedPod>,
    granted_to: Option<&str>,
) -> PodPresence {
    let Some(pod) = pod else {
        return PodPresence::Missing;
    };
    let uid = pod.uid.as_deref();
    let expected = [claim.pod_owner_uid.as_deref(), granted_to];
    if expected.iter().flatten().any(|want| uid != Some(*want)) {
        PodPresence::Missing
    } else {
        PodPresence::Present
    }
}

/// Makes the pods of the lease's namespace carry its token annotation exactly when they hold
/// it: set on the holder's pod (if the lease annotates), removed from every other pod.
pub async fn repair_annotations(
    kube: &Kube,
    memory: &Memory,
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
        .and_then(|h| Some((h.pod_name.clone()?, h.pod_uid.clone())))
        .map(|(pod, uid)| (pod, uid, status.fencing_token.to_string()));
    // Only the pod the grant was made to, by UID, carries the token (I5).
    let is_wanted = |p: &CachedPod| {
        wanted.as_ref().is_some_and(|(name, uid, _)| {
            &p.name == name && uid.as_ref().is_none_or(|u| p.uid.as_ref() == Some(u))
        })
    };

    // The annotated pods (by index) and the holder's pod: never a scan of every pod.
    let mut names = memory.pods_by_lease.get(ns, lease_name);
    names.extend(wanted.as_ref().map(|(name, _, _)| name.clone()));
    names.sort();
    names.dedup();
    let pods = names
        .iter()
        .filter_map(|name| memory.pods.get(ns, name))
        .filter(|p| p.token(lease_name).is_some() || is_wanted(p));
    let api: Api<Pod> = Api::namespaced(kube.client.clone(), ns);
    for pod in pods {
        // The cache has not shown this operator's own last write of the pod yet: that write
        // already did what this one would. The pod's event brings the next reconcile.
        if memory
            .written
            .is_superseded(pod.uid.as_deref(), pod.resource_version.as_deref())
        {
            continue;
        }
        let name = pod.name.clone();
        let desired = wanted
            .as_ref()
            .filter(|_| is_wanted(&pod))
            .map(|(_, _, token)| token.as_str());
        let current = pod.token(lease_name);
        if current == desired {
            continue;
        }
        set_annotation(kube, memory, &api, &pod, &key, desired).await?;
        tracing::debug!(pod = %name, lease = %lease_name, token = ?desired, "pod annotation set");
    }
    Ok(())
}

/// Sets (or with `None` removes) annotation `key` on `pod`, preconditioned on the pod's UID:
/// a pod replaced under the same name since the cache saw it is never written.
pub async fn set_annotation(
    kube: &Kube,
    memory: &Memory,
    api: &Api<Pod>,
    pod: &CachedPod,
    key: &str,
    value: Option<&str>,
) -> Result<()> {
    let name = &pod.name;
    let patch = json!({ "metadata": { "uid": pod.uid, "annotations": { key: value } } });
    let (params, patch) = (PatchParams::default(), Patch::Merge(&patch));
    let write = api.patch_metadata(name, &params, &patch);
    let (uid, before) = (pod.uid.as_deref(), pod.resource_version.as_deref());
    match write_watched(kube, memory, "annotate pod", uid, before, write).await {
        Ok(_) => Ok(()),
        // Gone meanwhile (its claim is released by the pod watch), or replaced by a pod of
        // another UID, which the precondition kept us from writing ("metadata.uid: field is
        // immutable"). Any other refusal (an admission policy, say) is an error.
        Err(e) if e.is_not_found() || e.is_uid_mismatch() => Ok(()),
        Err(e) => Err(e),
    }
}
