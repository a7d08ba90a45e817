//! Holder pods: whether the pod a claim names exists, and the token annotation on it.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use kube::core::PartialObjectMeta;
use serde_json::json;

use super::cache::{Cache, Keyed};
use super::cached::CachedClaim;
use super::context::Context;
use super::decide::PodPresence;
use super::error::{Result, timed};
use crate::api::{FencedLease, TOKEN_ANNOTATION_PREFIX, token_annotation_key};

/// What the operator keeps of a pod: its name, UID and version, and its token annotations.
/// Pods are most of the objects it watches; kept as metadata objects, 10,000 of them took
/// ~1.1 KiB each (a map of even one annotation is a B-tree node of ~0.5 KiB), this ~0.4 KiB.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CachedPod {
    pub name: String,
    pub namespace: String,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    /// `(lease, token)` of each `token.fencing.dev/<lease>` annotation.
    pub tokens: Vec<(String, String)>,
}

impl CachedPod {
    pub fn from_meta(pod: PartialObjectMeta<Pod>) -> Self {
        let meta = pod.metadata;
        let tokens = meta
            .annotations
            .into_iter()
            .flatten()
            .filter_map(|(key, value)| {
                let lease = key
                    .strip_prefix(TOKEN_ANNOTATION_PREFIX)?
                    .strip_prefix('/')?;
                Some((lease.to_owned(), value))
            })
            .collect();
        Self {
            name: meta.name.unwrap_or_default(),
            namespace: meta.namespace.unwrap_or_default(),
            uid: meta.uid,
            resource_version: meta.resource_version,
            tokens,
        }
    }

    /// Its token annotation of lease `lease`, if any.
    pub fn token(&self, lease: &str) -> Option<&str> {
        self.tokens
            .iter()
            .find(|(l, _)| l == lease)
            .map(|(_, token)| token.as_str())
    }

    /// The leases whose token annotation it carries.
    pub fn leases(&self) -> Vec<String> {
        self.tokens.iter().map(|(lease, _)| lease.clone()).collect()
    }
}

impl Keyed for CachedPod {
    fn namespace(&self) -> &str {
        &self.namespace
    }

    fn name(&self) -> &str {
        &self.name
    }
}

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
    ctx: &Context,
    claim: &CachedClaim,
    granted_to: Option<&str>,
) -> Result<PodPresence> {
    let (Some(pod_name), Some(ns)) = (&claim.spec.pod_name, &claim.metadata.namespace) else {
        return Ok(PodPresence::NotNamed);
    };
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let pod = timed("read pod", ctx.api_timeout, api.get_metadata_opt(pod_name)).await?;
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
        .and_then(|h| Some((h.pod_name.clone()?, h.pod_uid.clone())))
        .map(|(pod, uid)| (pod, uid, status.fencing_token.to_string()));
    // Only the pod the grant was made to, by UID, carries the token (I5).
    let is_wanted = |p: &CachedPod| {
        wanted.as_ref().is_some_and(|(name, uid, _)| {
            &p.name == name && uid.as_ref().is_none_or(|u| p.uid.as_ref() == Some(u))
        })
    };

    // The annotated pods (by index) and the holder's pod: never a scan of every pod.
    let mut names = ctx.pods_by_lease.get(ns, lease_name);
    names.extend(wanted.as_ref().map(|(name, _, _)| name.clone()));
    names.sort();
    names.dedup();
    let pods = names
        .iter()
        .filter_map(|name| ctx.pods.get(ns, name))
        .filter(|p| p.token(lease_name).is_some() || is_wanted(p));
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    for pod in pods {
        // The cache has not shown this operator's own last write of the pod yet: that write
        // already did what this one would. The pod's event brings the next reconcile.
        if ctx
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
        set_annotation(ctx, &api, &pod, &key, desired).await?;
        tracing::debug!(pod = %name, lease = %lease_name, token = ?desired, "pod annotation set");
    }
    Ok(())
}

/// Sets (or with `None` removes) annotation `key` on `pod`, preconditioned on the pod's UID:
/// a pod replaced under the same name since the cache saw it is never written.
pub async fn set_annotation(
    ctx: &Context,
    api: &Api<Pod>,
    pod: &CachedPod,
    key: &str,
    value: Option<&str>,
) -> Result<()> {
    let name = &pod.name;
    let patch = json!({ "metadata": { "uid": pod.uid, "annotations": { key: value } } });
    match timed(
        "annotate pod",
        ctx.api_timeout,
        api.patch_metadata(name, &PatchParams::default(), &Patch::Merge(&patch)),
    )
    .await
    {
        Ok(written) => {
            ctx.written.wrote(
                written.metadata.uid.as_deref().unwrap_or_default(),
                pod.resource_version.as_deref(),
                written.metadata.resource_version.as_deref(),
            );
            Ok(())
        }
        // Gone meanwhile (its claim is released by the pod watch), or replaced by a pod of
        // another UID, which the precondition kept us from writing ("metadata.uid: field is
        // immutable"). Any other refusal (an admission policy, say) is an error.
        Err(e) if e.is_not_found() || e.is_uid_mismatch() => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_pod_keeps_its_identity_and_token_annotations_only() {
        let pod: PartialObjectMeta<Pod> = serde_json::from_value(json!({
            "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
            "metadata": {
                "name": "web-0", "namespace": "ns", "uid": "u-1", "resourceVersion": "7",
                "labels": {"app": "web"},
                "annotations": {
                    "token.fencing.dev/db": "12",
                    "token.fencing.dev.example/x": "another tool's",
                    "token.fencing.dev": "no lease",
                    "kubectl.kubernetes.io/last-applied-configuration": "{}"
                }
            }
        }))
        .unwrap();
        let cached = CachedPod::from_meta(pod);
        assert_eq!(
            cached,
            CachedPod {
                name: "web-0".into(),
                namespace: "ns".into(),
                uid: Some("u-1".into()),
                resource_version: Some("7".into()),
                tokens: vec![("db".into(), "12".into())],
            }
        );
        assert_eq!(cached.token("db"), Some("12"));
        assert_eq!(cached.token("x"), None);
        assert_eq!(
            (Keyed::namespace(&cached), Keyed::name(&cached)),
            ("ns", "web-0")
        );
    }
}
